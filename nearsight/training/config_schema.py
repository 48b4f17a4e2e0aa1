"""The training settings' schema: one dataclass per section of a config file
(nearsight.training.config loads, merges and validates them; config_checks checks them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml

from nearsight.models.spec import ModelSpec, TrunkFields


@dataclass
class DataConfig:
    dataset: str = "folder"
    root: str = ""
    image_size: int = ModelSpec.image_size
    # test-time short side; None = image_size * 256 / 224 (a timm trunk: image_size / the
    # crop share of its pretrained config)
    resize: int | None = None
    crop_scale: list[float] = field(default_factory=lambda: [0.16, 1.0])  # RandomResizedCrop
    flip: bool = True
    workers: int = 2
    eval_batch_size: int = 64
    # classes held out of the training split to choose best.pt by (val/recall@1): a number of
    # classes, or a share of them when below 1; 0 = none (best.pt is then chosen on the test
    # split, as Proxy Anchor's code does). Class-disjoint and drawn with `seed`.
    val_classes: float = 0
    # decode and resize every training image once and keep it in memory (small datasets: the
    # per-step PNG decoding then disappears); the augmentation still runs per draw
    cache_images: bool = False


@dataclass
class ModelConfig(TrunkFields):
    # the network's fields are the spec's (nearsight/models/spec.py says what each means); the
    # size is data.image_size, and the trunk's interpolation and statistics are read from its
    # pretrained config. "auto" pooling and feature_norm are resolved as EmbeddingConfig does.
    pooling: str = "auto"
    feature_norm: str = "auto"
    heads: list[str] = field(default_factory=lambda: list(ModelSpec.heads))
    # auto (default: the trunk's pretrained weights when they are cached - torchvision's cache
    # for a ResNet, the Hugging Face cache for timm:NAME - else none, with a note line) |
    # imagenet | imagenet-v1 | imagenet-v2 (ResNets) | hub (timm) | none | FILE
    pretrained: str = "auto"
    freeze_bn: bool | None = None  # None: True from pretrained weights, False from scratch


@dataclass
class LossConfig:
    name: str = "ice"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class SamplerConfig:
    # auto (the (m,n)-group design for bcontrastive, m-per-class otherwise) | group |
    # m_per_class | random (the p-random pair design). A batch holds classes_per_batch x
    # per_class images; params are further keyword arguments of the sampler (e.g. p).
    name: str = "auto"
    classes_per_batch: int = 16
    per_class: int = 4
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    name: str = "adam"  # adam | adamw | sgd
    # None = chosen by the starting point (see resolve_defaults): from pretrained weights the
    # trunk at 1e-5 and the head at 1e-4; from scratch both at 1e-3
    lr: float | None = None  # the trunk
    head_lr: float | None = None  # new layers (the embedding head)
    weight_decay: float = 5e-4
    momentum: float = 0.9  # sgd only
    # constant | step | cosine | auto (cosine from scratch, constant from pretrained weights);
    # see nearsight/training/schedule.py
    schedule: str = "auto"
    milestones: list[float] = field(default_factory=list)  # "step": steps, or shares when < 1
    gamma: float = 0.1
    # "cosine": the share of the run after which the decay begins (warmup, then the rate holds,
    # then a cosine tail); 0: the cosine spans the whole run
    decay_start: float = 0.0
    warmup_steps: int | None = None  # None: 0 from pretrained weights, ~5% of steps from scratch
    # learning rate of parameters a loss owns and trains with the embedding (class proxies, a
    # learnt margin); None = head_lr
    loss_lr: float | None = None
    # the first steps train only the new layers (heads, a loss's own parameters), the trunk
    # frozen: Proxy Anchor's warm-up epoch
    freeze_trunk_steps: int = 0
    # clip every gradient element (the network's and the loss's own parameters) to
    # [-value, value] before each update, as Proxy Anchor's code does; None = no clipping
    clip_grad_value: float | None = None
    # RankMI's statistics network (Algorithm 1) has its own Adam
    critic_lr: float = 1e-3
    critic_weight_decay: float = 1e-4


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # updates of the embedding network (RankMI's critic batches between them do not count);
    # `epochs` (passes of the batch sampler) wins when set
    steps: int | None = 1000
    epochs: int | None = None
    # training seconds (evaluations excluded): the run stops, with its final evaluation, and
    # the schedule decays, by whichever of steps/epochs and this limit comes first
    time_limit_s: float | None = None
    # the training speed a recipe was sized for (steps per second of training on the machine
    # it names); a run measured at under half of it says so once, with what to do (the demo's
    # recipe sets it; None: no such note)
    expected_steps_per_s: float | None = None
    eval_every: int = 500  # steps; every run also ends with an evaluation
    eval_at_start: bool = False  # also evaluate the untrained network (step 0)
    save_every: int = 100  # steps between last.pt saves (and at every evaluation)
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    # how evaluations normalise NMI's mutual information: arithmetic | geometric mean of the
    # two entropies (nearsight reproduce sets the paper's)
    nmi_average: str = "arithmetic"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    # torch's threads on a CPU: "cores" (one per core, torch's default), a number, or
    # "measured": timed on the run's own steps at all, half and one of the cores, the fastest
    # kept and timed again when the steps' time moves (nearsight/training/thread_probe.py)
    cpu_threads: int | str = "cores"
    # auto: on where the hardware runs bf16 natively (CUDA, AVX512-BF16/AMX CPUs); the losses
    # compute in float32 either way (nearsight/models/hardware.py)
    amp: bool | str = "auto"  # bf16 autocast
    channels_last: bool | str = "auto"
    # torch.compile of the step's network and loss: auto (CUDA: mode default; CPU: off), off
    # (or false), true (mode default), or a mode: default | reduce-overhead |
    # max-autotune-no-cudagraphs | max-autotune
    compile: bool | str = "auto"
    log_every: int = 10
    # the settings resolve_defaults chose (dotted names); written into config.yaml
    auto: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def dump(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
