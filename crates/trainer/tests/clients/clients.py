"""Drives `tinygpt serve` through the client libraries people use: the OpenAI SDK and
LangChain. Prints one JSON object with what each call returned; tests/clients.rs checks it
against tinygpt's own commands.

Usage: clients.py BASE_URL FORCED_TOKEN_ID
"""

import json
import sys

from langchain_openai import ChatOpenAI, OpenAI
from openai import OpenAI as Client

base_url, forced = sys.argv[1], int(sys.argv[2])
client = Client(base_url=base_url, api_key="unused")
report = {}

# Completions, whole and streamed, with OpenAI's own fields.
settings = dict(model="run", prompt="Of Man", max_tokens=20, temperature=0.8, seed=7,
                frequency_penalty=0.5, presence_penalty=0.25)
whole = client.completions.create(**settings)
report["completion"] = whole.choices[0].text
report["completion_usage"] = whole.usage.model_dump(exclude_none=True)
chunks = client.completions.create(**settings, stream=True,
                                   stream_options={"include_usage": True})
report["completion_streamed"] = ""
for chunk in chunks:
    if chunk.choices:
        report["completion_streamed"] += chunk.choices[0].text
    if chunk.usage:
        report["completion_streamed_usage"] = chunk.usage.model_dump(exclude_none=True)

# logit_bias forcing one token.
forced_text = client.completions.create(model="run", prompt="Of", max_tokens=8,
                                        logit_bias={str(forced): 100})
report["forced"] = forced_text.choices[0].text

# Scoring as evaluation harnesses do: echo, no new tokens, logprobs.
scored = client.completions.create(model="run", prompt="Of Man's first", max_tokens=0,
                                   echo=True, logprobs=1, temperature=0)
report["scored_text"] = scored.choices[0].text
report["scored_tokens"] = scored.choices[0].logprobs.tokens
report["scored_logprobs"] = scored.choices[0].logprobs.token_logprobs

# Chat, whole and streamed.
messages = [{"role": "user", "content": "Of Man"}]
chat = client.chat.completions.create(model="run", messages=messages, max_tokens=20, seed=5)
report["chat"] = chat.choices[0].message.content
report["chat_role"] = chat.choices[0].message.role
streamed = client.chat.completions.create(model="run", messages=messages, max_tokens=20, seed=5,
                                          stream=True)
report["chat_streamed"] = "".join(c.choices[0].delta.content or "" for c in streamed
                                  if c.choices)

# LangChain: the completions model and the chat model, invoke and stream.
llm = OpenAI(base_url=base_url, api_key="unused", model="run", max_tokens=20, temperature=0)
report["langchain_invoke"] = llm.invoke("Of Man")
report["langchain_stream"] = "".join(llm.stream("Of Man"))
chat_llm = ChatOpenAI(base_url=base_url, api_key="unused", model="run", max_tokens=20,
                      temperature=0)
report["langchain_chat_invoke"] = chat_llm.invoke("Of Man").content
report["langchain_chat_stream"] = "".join(c.content for c in chat_llm.stream("Of Man"))

print(json.dumps(report))
