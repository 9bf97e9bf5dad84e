"""The benchmarks: tools beside the product that measure it through the packages' public surfaces.

``python -m bot bench`` (:mod:`benchmarks.gpt`: GPT decode tokens/s, time to first audio, RTF and peak memory of
every engine, beside the naive baseline), ``bench-streams`` (:mod:`benchmarks.streams`: real-time speech streams
held at once) and ``bench-http`` (:mod:`benchmarks.http`: time to first byte of every HTTP door). The bot's command
line adds these commands with :func:`add_commands`; nothing else imports this package. Importing it is light: each
benchmark module (torch, aiohttp, the models) loads only when its command runs.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any, Callable

__all__ = ["add_commands"]


def _runner(module: str, function: str) -> Callable[[Any, argparse.Namespace], int]:
    """A command's handler that imports its benchmark module when it runs."""

    def run(config: Any, args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), function)(config, args))

    return run


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``bench``, ``bench-streams`` and ``bench-http`` to the command line's subparsers ``sub`` (each with the
    ``common`` options); a parsed command carries its handler as ``args.run(config, args)``."""
    sp = sub.add_parser("bench", parents=[common], help="benchmark the engines (prints a table)")
    sp.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    sp.add_argument("--sizes", default="tiny,real")
    sp.add_argument("--engines", default="naive,torch,int8,onnx,pipeline,accuracy,families",
                    help="any of naive, torch, int8, onnx, graph (the onnx engine with its GPT step graphs instead of "
                         "the fused CPU step), voc32 (the onnx engine with int8 GPT and the fp32 vocoder that auto's int8 "
                         "vocoder replaces; with pipeline: its pipeline rows too), pipeline, accuracy (int8 vs fp32, teacher-forced), families (the vocoder RTF of "
                         "v2, v2Pro and v2ProPlus on torch and onnx), dit (the DiT ms per step and 48 kHz vocoder RTF "
                         "of the diffusion families, each decoder path beside the naive one, then each family's "
                         "whole pipeline beside upstream's; not in the default)")
    sp.add_argument("--dit-families", default="v4,v5turbo,v5dev", help="families the dit rows measure")
    sp.add_argument("--dit-frames", type=int, default=1000,
                    help="frames per DiT sampler call in the dit rows (real size; 1000: a whole chunk)")
    sp.add_argument("--contend", default="0", help="busy-looping processes beside the measurements: N, or 0,1")
    sp.add_argument("--batches", default="1,8")
    sp.add_argument("--steps", type=int, default=100, help="decode steps per measurement (100: a 4 s sentence)")
    sp.set_defaults(run=_runner("benchmarks.gpt", "run_bench"))

    sp = sub.add_parser("bench-streams", parents=[common],
                        help="how many real-time speech streams this machine holds at once")
    sp.add_argument("--streams", default=None, help="stream counts to try, like 1,2,4,8 (the default)")
    sp.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    sp.add_argument("--pace", type=int, default=0,
                    help="end each sentence after this many semantic tokens per phone (random-weight models with "
                         "their EOS zeroed; 2 is a natural pace; 0: off)")
    sp.set_defaults(run=_runner("benchmarks.streams", "run_streams_bench"))

    sp = sub.add_parser("bench-http", parents=[common], help="time to first byte of every HTTP protocol")
    sp.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    sp.add_argument("--repeat", type=int, default=None, help="requests per row (medians are reported)")
    sp.set_defaults(run=_runner("benchmarks.http", "run_http_bench"))
