"""What one torchrun stage should do, written by the controller and read by every rank."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.model.checkpoint import DEFAULT_STRICTNESS
from harness.model.gpt import ModelSize
from harness.model.recipes import DEFAULT_RECIPE
from harness.records import Patch
from harness.topology.topology import Topology


@dataclass
class StageSpec:
    stage: str  # a Stage: save, load or dump-metadata
    topology: str  # topology id, e.g. tp4-etp1-ep8-pp1
    tier: str  # cpu | gpu-shared | gpu
    backend: str  # local | te
    ckpt_dir: str
    reference_dir: str  # where the save stage leaves the topology-independent reference
    patch: str = Patch.NONE.value  # a Patch
    recipe: str = DEFAULT_RECIPE  # the quantization recipe (harness/model/recipes.py)
    size: dict = field(default_factory=lambda: ModelSize().as_dict())
    seed: int = 1234
    # Megatron-LM training saves with singleton_local_shards=True (per-expert keys such as
    # "...experts.experts.16.linear_fc1.weight_quantizer._amax", as in the report).
    singleton_local_shards: bool = True
    strict_load: bool = True  # Megatron-LM's load_checkpoint default
    dist_ckpt_strictness: str = DEFAULT_STRICTNESS  # Megatron-LM's --dist-ckpt-strictness default
    megatron_lm_load: bool = False  # strict load_state_dict, non-strict once more on error
    validate_sharding: bool = True  # megatron-core's default at save and load
    logits_reference: str = "save-topology"  # harness/check/logits.py LOGITS_REFERENCES
    output: str = ""  # dump-metadata: the JSON file to write

    @property
    def topo(self) -> Topology:
        return Topology.parse(self.topology)

    @property
    def model_size(self) -> ModelSize:
        return ModelSize(**self.size)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def read(cls, path: Path | str) -> "StageSpec":
        return cls(**json.loads(Path(path).read_text()))
