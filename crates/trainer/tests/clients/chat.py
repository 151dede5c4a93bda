"""Asks `tinygpt serve`'s model, through the OpenAI SDK's chat call, to shout each word (the
task of the conversations tests/clients.rs fine-tunes it on). Prints a JSON list of each reply's
content and finish_reason.

Usage: chat.py BASE_URL WORD...
"""

import json
import sys

from openai import OpenAI

base_url, words = sys.argv[1], sys.argv[2:]
client = OpenAI(base_url=base_url, api_key="unused")
model = client.models.list().data[0].id
answers = []
for word in words:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"shout {word}"}],
        temperature=0, max_tokens=20)
    choice = reply.choices[0]
    answers.append({"content": choice.message.content, "finish_reason": choice.finish_reason})
print(json.dumps(answers))
