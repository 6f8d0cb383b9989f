# ruff: noqa: E501  (the published chat templates, kept as their JSON strings split)
"""Tiny random Hugging Face checkpoints the tests write themselves: Qwen 3, Llama 3.2
(rope_scaling llama3) and Gemma 3 (its published RoPE bases, 1e6 for full attention and 1e4
for sliding-window attention) saved by transformers' save_pretrained, each with a byte-level
BPE tokenizer.json trained here by the `tokenizers` library and its family's own chat template
(the published Qwen3 / Llama 3.2 / Gemma 3 tokenizer_config.json templates). Needs torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Qwen/Qwen3-8B tokenizer_config.json's chat_template
QWEN3_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}"
    "\n        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n\\nYou "
    "may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    'function signatures within <tools></tools> XML tags:\\n<tools>" }}\n    {%- for tool in tools'
    ' %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- "\\n</tools>'
    "\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n{%- else %}\n    {%- if messages[0].role =='
    " 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, "
    "last_query_index=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set "
    "index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and "
    'message.role == "user" and message.content is string and not(message.content.startswith('
    "'<tool_response>') and message.content.endswith('</tool_response>')) %}\n        {%- set "
    "ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}"
    "\n{%- endfor %}\n{%- for message in messages %}\n    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n"
    '    {%- endif %}\n    {%- if (message.role == "user") or (message.role == "system" and not '
    "loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + "
    "'\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {%- set reasoning_content = "
    "'' %}\n        {%- if message.reasoning_content is string %}\n            {%- set "
    "reasoning_content = message.reasoning_content %}\n        {%- else %}\n            {%- if "
    "'</think>' in content %}\n                {%- set reasoning_content = content.split("
    "'</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n                {%- set "
    "content = content.split('</think>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        "
    "{%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n            {%- if "
    "loop.last or (not loop.last and reasoning_content) %}\n                {{- '<|im_start|>' + "
    "message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + "
    "content.lstrip('\\n') }}\n            {%- else %}\n                {{- '<|im_start|>' + "
    "message.role + '\\n' + content }}\n            {%- endif %}\n        {%- else %}\n            "
    "{{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n        {%- if "
    "message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n                "
    "{%- if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n    "
    "            {%- endif %}\n                {%- if tool_call.function %}\n                    "
    "{%- set tool_call = tool_call.function %}\n                {%- endif %}\n                {{- "
    '\'<tool_call>\\n{"name": "\' }}\n                {{- tool_call.name }}\n                {{- '
    '\'", "arguments": \' }}\n                {%- if tool_call.arguments is string %}\n           '
    "         {{- tool_call.arguments }}\n                {%- else %}\n                    {{- "
    "tool_call.arguments | tojson }}\n                {%- endif %}\n                {{- '}\\n"
    "</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n'"
    ' }}\n    {%- elif message.role == "tool" %}\n        {%- if loop.first or (messages['
    "loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- "
    "endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- content }}\n        {{- '\\n"
    '</tool_response>\' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != "tool")'
    " %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}"
    "\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if "
    "enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n"
    "</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}"
)

# meta-llama/Llama-3.2-1B-Instruct tokenizer_config.json's chat_template (tool use kept)
LLAMA32_TEMPLATE = (
    "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n"
    "{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set "
    "tools_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n    {%- "
    'if strftime_now is defined %}\n        {%- set date_string = strftime_now("%d %b %Y") %}\n'
    '    {%- else %}\n        {%- set date_string = "26 Jul 2024" %}\n    {%- endif %}\n{%- endif '
    "%}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block"
    " extracts the system message, so we can slot it into the right place. #}\n{%- if messages[0]"
    "['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- "
    'set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = "" %}\n{%- endif %}'
    '\n\n{#- System message #}\n{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n{%- if '
    'tools is not none %}\n    {{- "Environment: ipython\\n" }}\n{%- endif %}\n{{- "Cutting '
    'Knowledge Date: December 2023\\n" }}\n{{- "Today Date: " + date_string + "\\n\\n" }}\n{%- if '
    'tools is not none and not tools_in_user_message %}\n    {{- "You have access to the following '
    'functions. To call a function, please respond with JSON for a function call." }}\n    {{- '
    '\'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    'and its value}.\' }}\n    {{- "Do not use variables.\\n\\n" }}\n    {%- for t in tools %}\n   '
    '     {{- t | tojson(indent=4) }}\n        {{- "\\n\\n" }}\n    {%- endfor %}\n{%- endif %}\n'
    '{{- system_message }}\n{{- "<|eot_id|>" }}\n\n{#- Custom tools are passed in a user message '
    "with some extra guidance #}\n{%- if tools_in_user_message and not tools is none %}\n    {#- "
    "Extract the first user message so we can plug it in here #}\n    {%- if messages | length != "
    "0 %}\n        {%- set first_user_message = messages[0]['content']|trim %}\n        {%- set "
    'messages = messages[1:] %}\n    {%- else %}\n        {{- raise_exception("Cannot put tools in '
    "the first user message when there's no first user message!\") }}\n{%- endif %}\n    {{- "
    "'<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n    {{- \"Given the following functions, "
    'please respond with a JSON for a function call " }}\n    {{- "with its proper arguments that '
    'best answers the given prompt.\\n\\n" }}\n    {{- \'Respond in the format {"name": function '
    'name, "parameters": dictionary of argument name and its value}.\' }}\n    {{- "Do not use '
    'variables.\\n\\n" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        '
    '{{- "\\n\\n" }}\n    {%- endfor %}\n    {{- first_user_message + "<|eot_id|>"}}\n{%- endif %}'
    "\n\n{%- for message in messages %}\n    {%- if not (message.role == 'ipython' or message.role "
    "== 'tool' or 'tool_calls' in message) %}\n        {{- '<|start_header_id|>' + message['role'] "
    "+ '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n    {%- elif "
    "'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n            "
    '{{- raise_exception("This model only supports single tool-calls at once!") }}\n        {%- '
    "endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n        {{- "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n        {{- '{\"name\": \"' + "
    "tool_call.name + '\", ' }}\n        {{- '\"parameters\": ' }}\n        {{- tool_call.arguments "
    '| tojson }}\n        {{- "}" }}\n        {{- "<|eot_id|>" }}\n    {%- elif message.role == '
    '"tool" or message.role == "ipython" %}\n        {{- "<|start_header_id|>ipython<|end_header_id|>'
    '\\n\\n" }}\n        {%- if message.content is mapping or message.content is iterable %}\n    '
    "        {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content "
    '}}\n        {%- endif %}\n        {{- "<|eot_id|>" }}\n    {%- endif %}\n{%- endfor %}\n{%- if '
    "add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)

# google/gemma-3-1b-it tokenizer_config.json's chat_template
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] "
    "is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    "
    "{%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + "
    "'\\n\\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n    {%- set loop_messages = messages -%}\n{%- endif '
    "-%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != "
    '(loop.index0 % 2 == 0) -%}\n        {{ raise_exception("Conversation roles must alternate '
    "user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == "
    "'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set "
    "role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\\n' + "
    "(first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}"
    "\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' "
    "-%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' "
    "-%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor "
    '-%}\n    {%- else -%}\n        {{ raise_exception("Invalid content type") }}\n    {%- endif '
    "-%}\n    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    "
    "{{'<start_of_turn>model\\n'}}\n{%- endif -%}\n"
)

FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        "bos": None,
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "template": QWEN3_TEMPLATE,
    },
    "llama3": {
        "specials": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": "<|end_of_text|>",
        "template": LLAMA32_TEMPLATE,
    },
    "gemma3": {  # Gemma's own ids: <pad> 0, <eos> 1, <bos> 2
        "specials": ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        "bos": "<bos>",
        "eos": "<eos>",
        "pad": "<pad>",
        "template": GEMMA3_TEMPLATE,
    },
}
# Gemma 3's published RoPE (google/gemma-3-1b-it): base 1e6 for full attention, 1e4 for the
# sliding-window layers; six layers hold one full-attention layer, and a window shorter than
# the test's sequences makes the sliding layers' masks matter
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
}
# Llama 3.2's published scaling, with a short original context so that a tiny test's positions
# reach the scaled band (the published 8192 would leave it unobservable at test lengths)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
CORPUS = [
    "What is 3 + 4? <reasoning>3 plus 4 is 7.</reasoning><answer>7</answer>",
    "Reverse the word 'abc'. The answer is cba.",
    "Add the numbers and give the answer in tags.",
] * 20


def write_tokenizer(family: str, directory: Path, vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer.json trained here, with the family's special tokens, saved
    with its tokenizer_config.json and chat template by transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=spec["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
    )
    fast.chat_template = spec["template"]
    fast.save_pretrained(directory)
    return fast


def write_checkpoint(family: str, directory: Path, seed: int = 0) -> Path:
    """A tiny random Qwen3ForCausalLM / LlamaForCausalLM (rope_scaling llama3) /
    Gemma3ForCausalLM with its tokenizer, saved by save_pretrained into `directory`."""
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    directory.mkdir(parents=True, exist_ok=True)
    fast = write_tokenizer(family, directory)
    shapes = {
        "vocab_size": len(fast),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "initializer_range": 0.2,  # logits well away from 0, so wrong RoPE shows
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
    }
    torch.manual_seed(seed)
    if family == "qwen3":
        rope = {"rope_type": "default", "rope_theta": 1_000_000.0}
        model: Any = Qwen3ForCausalLM(Qwen3Config(**shapes, rope_parameters=rope))
    elif family == "llama3":
        model = LlamaForCausalLM(LlamaConfig(**shapes, rope_parameters=dict(LLAMA3_ROPE)))
    else:
        gemma = {"num_hidden_layers": 6, "query_pre_attn_scalar": 16, "sliding_window": 8}
        rope = {kind: dict(entry) for kind, entry in GEMMA3_ROPE.items()}
        config = Gemma3TextConfig(**shapes | gemma, rope_parameters=rope)
        model = Gemma3ForCausalLM(config)
    model.save_pretrained(directory)
    return directory
