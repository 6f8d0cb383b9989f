"""Load FAR's `--adapter` export with peft, on the base export beside it, and answer."""

import sys

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path)  # the checkpoint's tokenizer and chat template
base = AutoModelForCausalLM.from_pretrained(f"{path}/base")  # a hub base: its repo id
model = PeftModel.from_pretrained(base, path)
instruction = "Give only the final answer inside <answer> </answer>."  # answer_format: answer
messages = [{"role": "user", "content": f"{instruction}\nReverse the word 'stone'."}]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
)
output = model.generate(**inputs, max_new_tokens=16)  # greedy, stops at the end of the turn
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :]))
