"""A small conversation set for trying supervised fine-tuning: "shout WORD" answered with the
word in capitals, for random words of 3 to 7 letters (a task a base model cannot do, whose
answers are easy to check). Writes JSONL of OpenAI `messages`, one conversation a line.

    python3 scripts/shout-conversations.py shout.jsonl [COUNT] [SEED]
"""
import json
import random
import sys

out = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
random.seed(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
letters = "abcdefghijklmnopqrstuvwxyz"
with open(out, "w") as f:
    for _ in range(count):
        word = "".join(random.choice(letters) for _ in range(random.randint(3, 7)))
        messages = [{"role": "user", "content": f"shout {word}"},
                    {"role": "assistant", "content": word.upper()}]
        f.write(json.dumps({"messages": messages}) + "\n")
