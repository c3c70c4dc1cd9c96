"""Rewrite a pickled ``pytorch_model.bin`` checkpoint (EAGLE-1/2 heads, older models) as safetensors.

    hyspec convert SRC OUT_DIR      # SRC: a directory with pytorch_model*.bin, or one .bin file

hyspec never unpickles while loading; this explicit step reads the tensors with
torch.load(weights_only=True) (torch's restricted unpickler: tensors and plain containers, no other
objects), writes OUT_DIR/model.safetensors, copies the JSON / tokenizer files, and says what it read.
"""
from __future__ import annotations

import argparse



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="a directory holding pytorch_model*.bin (sharded or not), or one .bin")
    parser.add_argument("out", metavar="OUT_DIR", help="the directory to create (must not exist, or be empty)")


def run(args: argparse.Namespace) -> int:
    # imported here: it imports torch, which the CLI must not do before the probe's autoload check
    from hyspec.model.convert_bin import convert_bin

    print(convert_bin(args.src, args.out).summary())
    return 0
