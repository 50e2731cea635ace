"""The config's sections: typed, frozen dataclasses (choices as Literal[...]), each checked when
built; what only the custom loop runs is read from the bindings' tables (``capabilities``).

Every field carries its help text in ``metadata["help"]``; ``describe()`` turns those into the
``hvdtrain train --help`` listing, so the documentation cannot drift from the code.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from hvdtrain.config import capabilities, checks, model_catalog
from hvdtrain.errors import UserError

# The choices of each string key: the type documents them, and ``_check_choices`` enforces them.
DataSource = Literal["synthetic", "digits", "npz", "tfrecord", "images"]
DataCache = Literal["auto", "on", "off"]
OptimizerName = Literal["sgd", "adam"]
LrScaling = Literal["auto", "linear", "sqrt", "none"]
LrDecay = Literal["constant", "cosine"]
Device = Literal["auto", "cpu", "gpu"]
Loop = Literal["fit", "custom"]
Precision = Literal["float32", "mixed_float16"]
Compression = Literal["none", "fp16"]
ReduceOp = Literal["average", "adasum"]


def _help(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)


@dataclass(frozen=True)
class DataConfig:
    source: DataSource = _help("where the samples come from", default="digits")
    path: str = _help("npz: a file with arrays x, y. tfrecord: a file, directory or glob "
                      "(comma-separated list allowed), or the output of 'hvdtrain data "
                      "convert'. images: a folder with one sub-folder of JPEG/PNG files per "
                      "class", default="")
    eval_path: str = _help("like path, for the eval set; empty: hold out eval_fraction of path",
                           default="")
    eval_fraction: float = _help("share of the data held out for eval when no eval_path is "
                                 "given (npz, synthetic)", default=0.2)
    num_samples: int = _help("synthetic: number of samples (train and eval together)",
                             default=2048)
    image_shape: tuple[int, ...] = _help("synthetic, tfrecord and images: shape of one input, "
                                         "e.g. 28,28,1 (images: every file is resized to "
                                         "height,width and converted to 1 or 3 channels)",
                                         default=(8, 8, 1))
    num_classes: int = _help("synthetic and tfrecord: number of classes (npz: taken as "
                             "max(y)+1 when 0; images and converted records: from the "
                             "class folders)", default=10)
    shuffle: bool = _help("reshuffle each rank's shard every epoch (seeded by train.seed "
                          "and the epoch)", default=True)
    shuffle_buffer: int = _help("tfrecord: records held in the shuffle buffer", default=10_000)
    cache: DataCache = _help("images and tfrecord: decode each rank's share once and keep it "
                             "in memory: on, off, or auto (when the share needs at most 1 GiB "
                             "decoded)", default="auto")
    verify_images: bool = _help("images: before training, every rank decodes its share of "
                                "the files once, so that a corrupt file stops the run at "
                                "once, named; off: a corrupt file fails the rank that reads "
                                "it", default=True)

    def __post_init__(self) -> None:
        _check_choices(self, "data")
        if self.source in ("npz", "tfrecord", "images") and not self.path:
            raise UserError(f"data.source={self.source} needs a file: pass "
                            f"--set data.path=PATH")
        checks.in_range("data.eval_fraction", self.eval_fraction, 0.0, 1.0, open_low=True,
                  open_high=True)
        checks.positive("data.num_samples", self.num_samples)
        if not self.image_shape or any(d <= 0 for d in self.image_shape):
            raise UserError(f"data.image_shape must be positive sizes such as 28,28,1, "
                            f"got {self.image_shape}")
        if self.num_classes < 0 or self.num_classes == 1:
            raise UserError(f"data.num_classes must be >= 2 (or 0 to infer it), "
                            f"got {self.num_classes}")
        checks.positive("data.shuffle_buffer", self.shuffle_buffer)
        if self.source == "images" and (len(self.image_shape) != 3
                                        or self.image_shape[-1] not in (1, 3)):
            raise UserError(f"data.source=images needs data.image_shape=height,width,channels "
                            f"with 1 (grey) or 3 (colour) channels, got {self.image_shape}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = _help(f"a registered model ({', '.join(model_catalog.names())}) or your own "
                      f"as package.module:function(input_shape, num_classes)", default="cnn")
    width: int = _help("mlp and cnn: units or filters of the first layer (later layers scale "
                       "from it)", default=64)
    dropout: float = _help("dropout rate before the classifier, 0 for none", default=0.0)
    fused_batch_norm: bool = _help("Keras 3: BatchNormalization layers compute with "
                                   "TensorFlow's fused kernel, as Keras 2's do (the same "
                                   "results to float rounding, faster); false: "
                                   "Keras 3's own element-wise ops", default=True)
    sync_batch_norm: bool = _help("BatchNormalization layers (bundled and user models) "
                                  "compute each training step's batch moments over all "
                                  "ranks' batches (synchronized batch normalization), so N "
                                  "ranks at batch B normalize as 1 rank at N x B: for small "
                                  "per-rank batches; one all-reduce per layer and step. "
                                  "Either way the moving statistics are averaged over ranks "
                                  "before each eval, checkpoint and export", default=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise UserError("model.name is empty: pass --set model.name=cnn (or another model)")
        checks.positive("model.width", self.width)
        checks.in_range("model.dropout", self.dropout, 0.0, 1.0, open_high=True)


@dataclass(frozen=True)
class OptimConfig:
    name: OptimizerName = _help("sgd (with momentum) or adam", default="sgd")
    lr: float = _help("learning rate for ONE rank; scaled by world size per lr_scaling",
                      default=0.05)
    momentum: float = _help("sgd momentum (0 for plain SGD)", default=0.9)
    lr_scaling: LrScaling = _help("how the learning rate grows with N ranks: linear (lr*N), "
                            "sqrt (lr*sqrt(N)), none, or auto: linear for the average, none "
                            "for horovod.op=adasum (Horovod's Adasum guide)", default="auto")
    warmup_epochs: float = _help("epochs over which the lr ramps from lr to the scaled lr "
                                 "(Goyal et al.); 0 for none", default=1.0)
    decay: LrDecay = _help("after warmup: constant | cosine (to 0 at the last epoch)",
                       default="constant")

    def __post_init__(self) -> None:
        _check_choices(self, "optim")
        checks.positive("optim.lr", self.lr)
        checks.in_range("optim.momentum", self.momentum, 0.0, 1.0, open_high=True)
        if self.warmup_epochs < 0:
            raise UserError(f"optim.warmup_epochs must be >= 0, got {self.warmup_epochs}")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _help("epochs to train (with --resume: the total, counting those done)",
                        default=10)
    batch_size: int = _help("samples per step on EACH rank; global batch = batch_size * N",
                            default=32)
    seed: int = _help("seed for weights, synthetic data and shuffling", default=42)
    eval_every: int = _help("evaluate on the eval set every k epochs (and always at the end); "
                            "0: only at the end", default=1)
    loop: Loop = _help("fit (Keras fit) | custom (hvdtrain's own tf.function step with "
                      "a tape that reduces the gradients; needed for horovod.op=adasum, "
                      "backward_passes_per_step > 1 and join_uneven)",
                      default="fit")
    precision: Precision = _help("float32 | mixed_float16 (float16 compute, float32 weights, with "
                           "loss scaling)", default="float32")
    consistency_check: bool = _help("compare the ranks' first batches, and their weights and "
                                    "optimizer settings at every epoch's end, and stop all "
                                    "ranks with one line where they differ", default=True)

    def __post_init__(self) -> None:
        _check_choices(self, "train")
        checks.positive("train.epochs", self.epochs)
        checks.positive("train.batch_size", self.batch_size)
        if self.eval_every < 0:
            raise UserError(f"train.eval_every must be >= 0, got {self.eval_every}")


@dataclass(frozen=True)
class RunConfig:
    run_dir: str = _help("where rank 0 writes checkpoints, logs and the model; empty: "
                         "runs/<preset>-<date>-<time>", default="")
    device: Device = _help("auto (one GPU per local rank if any, else CPU) | cpu | gpu",
                        default="auto")
    intra_op_threads: int = _help("TensorFlow threads inside one op, per rank; 0: this rank's "
                                  "share of the cores", default=0)
    inter_op_threads: int = _help("TensorFlow ops run in parallel, per rank; 0: 2, or 1 on "
                                  "one core without buckets in force (horovod.bucket_mb; with "
                                  "buckets, 2 let each start during backprop)", default=0)
    keep_checkpoints: int = _help("checkpoints kept in run_dir/checkpoints (oldest removed)",
                                  default=3)
    tensorboard: bool = _help("write TensorBoard logs to run_dir/tensorboard", default=True)
    export: bool = _help("save the trained model to run_dir/model (Keras 3: model.keras; "
                         "Keras 2: a SavedModel)", default=True)
    progress_every_s: float = _help("within an epoch, print a progress line every this many "
                                    "seconds; 0: one line per epoch only", default=30.0)
    stall_warning_s: int = _help("Horovod's stall check: warn, naming the tensor and the missing "
                                 "ranks, when some ranks wait this long for the others in a "
                                 "collective", default=60)
    stall_abort_s: int = _help("abort the job when ranks wait this long in a collective "
                               "(>= stall_warning_s); 0: wait forever", default=600)
    private: bool = _help("rank 0 makes run_dir owner-only (0700) and writes its files "
                          "owner-only (umask 077); false: your umask decides", default=True)

    def __post_init__(self) -> None:
        _check_choices(self, "run")
        for name in ("intra_op_threads", "inter_op_threads"):
            if getattr(self, name) < 0:
                raise UserError(f"run.{name} must be >= 0, got {getattr(self, name)}")
        checks.positive("run.keep_checkpoints", self.keep_checkpoints)
        if self.progress_every_s < 0:
            raise UserError(f"run.progress_every_s must be >= 0, got {self.progress_every_s}")
        checks.positive("run.stall_warning_s", self.stall_warning_s)
        if self.stall_abort_s and self.stall_abort_s < self.stall_warning_s:
            raise UserError(f"run.stall_abort_s={self.stall_abort_s} must be 0 (never) or >= "
                            f"run.stall_warning_s={self.stall_warning_s}")


MB = 1024 * 1024  # the unit of the horovod section's *_mb options, in bytes
AUTO_BUCKET_MB = 2.0  # horovod.bucket_mb's auto across hosts: docs/horovod-options.md, bucket_mb


@dataclass(frozen=True)
class HorovodConfig:
    compression: Compression = _help("none | fp16: gradients cast to float16 for the all-reduce "
                                     "(half the bytes on the wire, ~3 significant digits)",
                                     default="none")
    backward_passes_per_step: int = _help("k: accumulate the gradients of k batches locally, "
                                          "then all-reduce and apply once (an effective batch "
                                          "of k * batch_size per rank; custom loop only)",
                                          default=1)
    op: ReduceOp = _help("average | adasum (Adasum reduction: MPI controller, a power-of-two "
                    "number of ranks)", default="average")
    sparse_as_dense: bool = _help("all-reduce sparse gradients (embeddings) as dense tensors "
                                  "instead of all-gathering their slices", default=False)
    fusion_threshold_mb: float = _help("tensor fusion buffer in MB (HOROVOD_FUSION_THRESHOLD); "
                                       "0 turns fusion off; -1: Horovod's default (128) or the "
                                       "launcher's setting", default=-1.0)
    cycle_time_ms: float = _help("ms between Horovod's background cycles (HOROVOD_CYCLE_TIME); "
                                 "-1: the launcher's setting, else hvdtrain's 0.2 (5 for a "
                                 "process alone: world size 1, not elastic)",
                                 default=-1.0)
    bucket_mb: float = _help("all-reduce the dense gradients in buckets of about this many "
                             "MB, the last layers' first, each one all-reduce that starts as "
                             "soon as backprop has computed its gradients (overlapping the "
                             "rest of backprop); 0: one all-reduce per step after the whole "
                             "backward pass; -1 (auto): 2 where the ranks are on several "
                             "hosts or elastic, else 0", default=-1.0)
    flatten: bool = _help("all-reduce each bucket of dense gradients as one flat tensor, split "
                          "back without copies; false: Horovod's grouped all-reduce (each "
                          "gradient a tensor of its own in the timeline, copied through "
                          "Horovod's fusion buffer)",
                          default=True)
    autotune: bool = _help("let Horovod tune fusion threshold and cycle time while training "
                           "(HOROVOD_AUTOTUNE)", default=False)
    timeline: str = _help("write a Horovod timeline (Chrome trace JSON) to this file, from "
                          "rank 0 (HOROVOD_TIMELINE); empty: none", default="")
    join_uneven: bool = _help("ranks may have different numbers of batches: each finishes its "
                              "own, then waits in hvd.join (custom loop only)", default=False)

    def __post_init__(self) -> None:
        _check_choices(self, "horovod")
        checks.positive("horovod.backward_passes_per_step", self.backward_passes_per_step)
        if self.fusion_threshold_mb < 0 and self.fusion_threshold_mb != -1:
            raise UserError(f"horovod.fusion_threshold_mb must be >= 0 (or -1 for Horovod's "
                            f"default), got {self.fusion_threshold_mb}")
        if self.bucket_mb < 0 and self.bucket_mb != -1:
            raise UserError(f"horovod.bucket_mb must be >= 0 (0: one all-reduce per step) or "
                            f"-1 (auto), got {self.bucket_mb}")
        if self.cycle_time_ms <= 0 and self.cycle_time_ms != -1:
            raise UserError(f"horovod.cycle_time_ms must be > 0 (or -1 for Horovod's "
                            f"default), got {self.cycle_time_ms}")

    def buckets_in_force(self, size: int, local_size: int, elastic: bool = False) -> float:
        """The reducer's bucket size in MB with ``size`` ranks, ``local_size`` on this host:
        ``bucket_mb``, or for -1 (auto) AUTO_BUCKET_MB where the ranks span hosts or may
        (``elastic``: a step traced in one world runs in the next, ranks match buckets by
        name), else 0: one fused all-reduce is cheapest on one host."""
        if self.bucket_mb != -1:
            return self.bucket_mb
        return AUTO_BUCKET_MB if elastic or local_size < size else 0.0


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    preset: str = "digits"

    def __post_init__(self) -> None:
        if self.train.loop == "custom":
            return
        # What fit runs is the bindings' tables' to say (capabilities.py), on both stacks.
        asked = {"adasum_in_fit": ("horovod.op=adasum", self.horovod.op == "adasum"),
                 "accumulation_in_fit": ("horovod.backward_passes_per_step>1",
                                         self.horovod.backward_passes_per_step > 1),
                 "join_uneven_in_fit": ("horovod.join_uneven=true", self.horovod.join_uneven)}
        for field_name, (option, wanted) in asked.items():
            why = capabilities.refused_by_any(field_name) if wanted else None
            if why:
                raise UserError(f"{option} needs the custom loop: {why}; pass --loop custom")


SECTIONS: dict[str, type] = {name: kind for name, kind in typing.get_type_hints(Config).items()
                             if name != "preset"}


# ---------------------------------------------------------------------------------------------
# Checks shared by the sections.

def _check_choices(section: Any, name: str) -> None:
    """Every key typed ``Literal[...]`` holds one of its choices."""
    for key, kind in typing.get_type_hints(type(section)).items():
        if typing.get_origin(kind) is Literal:
            checks.one_of(f"{name}.{key}", getattr(section, key), typing.get_args(kind))
