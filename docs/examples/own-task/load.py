"""Load a FAR export with transformers and answer one question of the task's own kind."""

import sys

from transformers import AutoModelForCausalLM, AutoTokenizer

path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
instruction = (  # the recipe's data.prompt default: FAR's tags
    "Think step by step inside <reasoning> </reasoning>, then give only the final answer "
    "inside <answer> </answer>."
)
messages = [
    {"role": "system", "content": instruction},
    {"role": "user", "content": "What is 3 plus 4?"},
]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
)
output = model.generate(**inputs)  # greedy, stops at <end_of_turn> (generation_config.json)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :]))
