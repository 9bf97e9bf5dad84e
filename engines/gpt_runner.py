"""The GPT as an engine plan runs it: every backend that decodes with the torch GPT loads it here."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from engines.base import EngineError
from engines.gpt_int8_proof import GptProof, prove_int8_gpt, proven
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.plan import EnginePlan

__all__ = ["load_gpt", "proof_kernels"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # the plan's float weight formats


def load_gpt(path: Path, plan: EnginePlan, proofs: Path | None = None) -> tuple[Text2SemanticModel, EnginePlan]:
    """The GPT checkpoint at ``path`` as ``plan`` runs it: on its device, in its weight format, with the fused CPU
    step when the plan's runner is ``fused``; and the plan as it then runs.

    An int8 GPT (weight-only or dynamic) serves only once its proof holds on this checkpoint
    (:mod:`engines.gpt_int8_proof`); a miss keeps the GPT in fp32 on the same runner, and the plan returned says so.

    Parameters
    ----------
    proofs: the folder the int8 proof's verdict is kept in (None: proven at every load).

    Raises
    ------
    EngineError
        the plan runs the fused step and it cannot be built here (a plan made for another machine).
    """
    lib: Any = None
    if plan.gpt_runner == "fused":
        lib = cpu_step.load_library()
        if lib is None:
            raise EngineError(f"the engine plan runs the fused CPU step, which cannot be built here "
                              f"({cpu_step.unavailable_reason()}); set engine.gpt_runner: auto")
    int8 = plan.gpt_weights.startswith("int8")
    gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(path), plan.device,
                                             torch.float32 if int8 else DTYPES[plan.gpt_weights])
    if not int8:
        return gpt.use_fused_step(lib), plan
    weight_only = plan.gpt_weights == "int8-weight-only"
    method = "weight-only" if weight_only else "dynamic"
    made: list[Text2SemanticModel] = []

    def prove() -> GptProof:
        # (before the reference fills fp32's cache)
        made.append(_int8(copy.deepcopy(gpt), weight_only, lib, plan.int8_gemm))
        return prove_int8_gpt(gpt.use_fused_step(lib), made[0], method)

    proof = proven(path, method, proofs, prove, proof_kernels(plan))
    if not proof.passed:
        return gpt.use_fused_step(lib), plan.gpt_in_fp32(
            f"the int8 GPT missed its proof on this model ({proof.reason}): it runs in fp32")
    return (made[0] if made else _int8(gpt, weight_only, lib, plan.int8_gemm)), plan


def proof_kernels(plan: EnginePlan) -> str:
    """What else, beside the method, the int8 GPT's proof holds for: another GEMM rounds the prefill's activations its
    own way, so it gets a verdict of its own ("": fbgemm's, the method's usual one)."""
    weight_only = plan.gpt_weights == "int8-weight-only"
    return "prefill onednn" if weight_only and plan.int8_gemm == "onednn" else ""


def _int8(gpt: Text2SemanticModel, weight_only: bool, lib: Any, gemm: str) -> Text2SemanticModel:
    """``gpt`` quantised in place as the plan runs it, with its step."""
    gpt.quantize_int8(weight_only=weight_only, gemm=gemm or "fbgemm")
    return gpt.use_fused_step(lib)
