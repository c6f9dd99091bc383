# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make the tiny Hugging Face Llama that molecule vllm_lws serves, without any hub.

Run with the vLLM venv's Python (scripts/build-vllm-cpu.sh: it has torch, transformers and
tokenizers):  .cache/vllm-venv/bin/python scripts/make-vllm-model.py --out .cache/vllm-model

Writes <out>/tiny-llama-hf-4L/: config.json, model.safetensors (random weights, seed 0, float32:
served as bfloat16, each vLLM rank then logs the weights it converts, which shows the layers it
holds) and a byte-level BPE tokenizer trained here on generated text (PreTrainedTokenizerFast).
Cached: a second run with the same recipe does nothing (the recipe is in <dir>/.llmfleet-recipe).
"""

import argparse
import json
import os
import shutil
from pathlib import Path

RECIPE = {
    "architecture": "LlamaForCausalLM",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "vocab_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "seed": 0,
}
NAME = "tiny-llama-hf-4L"


def corpus():
    text = (
        "the a fleet of small hosts serves one model split by layers across nodes where each rank "
        "holds its own share of the weights and the leader answers every request over http while "
        "the worker computes the last layers and sends the logits back"
    )
    words = text.split(" ")
    for i in range(2000):
        yield " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + f" {i}."


def make(out):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target = os.path.join(out, NAME)
    stamp = os.path.join(target, ".llmfleet-recipe")
    recipe = json.dumps(RECIPE, sort_keys=True)
    if os.path.exists(stamp) and Path(stamp).read_text() == recipe:
        print(f"make-vllm-model: cached {target}")
        return target
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"],
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.model_max_length = RECIPE["max_position_embeddings"]
    fast.save_pretrained(tmp)

    torch.manual_seed(RECIPE["seed"])
    config = LlamaConfig(
        vocab_size=RECIPE["vocab_size"],
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        tie_word_embeddings=RECIPE["tie_word_embeddings"],
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(tmp, safe_serialization=True)
    with open(os.path.join(tmp, ".llmfleet-recipe"), "w") as fh:
        fh.write(recipe)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(tmp, target)
    print(f"make-vllm-model: wrote {target}")
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    make(args.out)


if __name__ == "__main__":
    main()
