"""The GPT as an engine plan runs it: every backend that decodes with the torch GPT loads it here."""

from __future__ import annotations

from pathlib import Path

import torch

from engines.base import EngineError
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.plan import EnginePlan

__all__ = ["load_gpt"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # the plan's float weight formats


def load_gpt(path: Path, plan: EnginePlan) -> Text2SemanticModel:
    """The GPT checkpoint at ``path`` as ``plan`` runs it: on its device, in its weight format (int8: weight-only
    or dynamic), with the fused CPU step when the plan's runner is ``fused``.

    Raises
    ------
    EngineError
        the plan runs the fused step and it cannot be built here (a plan made for another machine).
    """
    int8 = plan.gpt_weights.startswith("int8")
    gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(path), plan.device,
                                             torch.float32 if int8 else DTYPES[plan.gpt_weights])
    if int8:
        gpt.quantize_int8(weight_only=plan.gpt_weights == "int8-weight-only")
    if plan.gpt_runner == "fused":
        lib = cpu_step.load_library()
        if lib is None:
            raise EngineError(f"the engine plan runs the fused CPU step, which cannot be built here "
                              f"({cpu_step.unavailable_reason()}); set engine.gpt_runner: auto")
        gpt.use_fused_step(lib)
    return gpt
