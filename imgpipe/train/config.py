"""The training configuration: YAML (``yaml.safe_load``) -> typed dataclasses, ``--set`` overrides, checks.

Sections: ``data``, ``model``, ``optim``, ``train``, ``output``. An unknown section or key is a
ConfigError naming it (with the closest valid key); a value of the wrong type names the key and
the type it needs. ``default_yaml()`` is what ``imgpipe train --print-config`` prints.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.oserrors import describe, write_probe
from imgpipe._sys.validate import MAX_SEED
from imgpipe.errors import ConfigError
from imgpipe.storage.source import is_url
from imgpipe.train.resolution import parse_resolution

DEFAULT_WARMUP_EPOCHS = 5.0  # before cosine and step (Goyal et al.'s gradual warm-up)


@dataclass
class DataConfig:
    """Where the packed dataset is and how to load it."""

    path: str = ""  # a packed folder, or its URL
    stage: str = ""  # a node-local folder: path is copied there once per node (imgpipe stage) and read from there
    cache: str = ""  # with a URL in data.path: a node-local folder that keeps what is read and ends as the packed folder
    backend: str = "torch"  # torch | dali | synthetic (in-memory batches: the compute ceiling)
    workers: int | None = None  # None: the loader's default, the CPUs per local rank (at most 8)
    prefetch_factor: int = 2  # torch backend: batches queued per worker; from a URL it fetches all but one ahead
    image_size: int = 224  # the training size when data.resolution is absent
    # progressive resizing: {start_px, end_px, start_ramp, end_ramp} (epochs; the sizes inside the ramp
    # rounded to a multiple of 32, as FFCV's), or one size per epoch (the last holds after the list)
    resolution: Any = None
    val_image_size: int | None = None  # the validation size (FixRes: above the training size); null: data.image_size
    val_crop_ratio: float = 0.875  # the validation center crop's share of the shorter side (224/256)
    val_flip_tta: bool = False  # validate on the mean logits of each image and its mirror
    train_split: str = "train"
    val_split: str = "val"

    @property
    def location(self) -> str:
        """Where the loaders read: the staged copy when there is one, else ``path``."""
        return self.stage or self.path


@dataclass
class ModelConfig:
    """Any torchvision classification model, or timm's as ``timm:NAME``; num_classes comes from the manifest unless set."""

    name: str = "resnet50"
    num_classes: int | None = None
    blurpool: bool = False  # an anti-aliasing blur before every strided convolution, as FFCV's BlurPoolConv2d


@dataclass
class OptimConfig:
    """SGD; lr = base_lr * global_batch / 256; BatchNorm and bias parameters decay by bn_weight_decay."""

    base_lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 1e-4
    bn_weight_decay: float = 0.0  # of BatchNorm weights and biases and of biases (parameters of one dimension)
    warmup_epochs: float | None = None  # null: 5 before cosine or step; none before linear_ramp, whose ramp is its warm-up
    schedule: str = "cosine"  # cosine | step | linear_ramp (FFCV's cyclic: up from 0 to the peak, then down to 0)
    lr_peak_epoch: float = 2.0  # linear_ramp: the epoch of the peak
    step_epochs: list[int] = field(default_factory=lambda: [30, 60, 80])
    step_gamma: float = 0.1
    label_smoothing: float = 0.1

    @property
    def warmup(self) -> float:
        """The warm-up in epochs: ``warmup_epochs``, else the schedule's (FFCV's linear_ramp has none of its own)."""
        if self.warmup_epochs is not None:
            return self.warmup_epochs
        return 0.0 if self.schedule == "linear_ramp" else DEFAULT_WARMUP_EPOCHS


@dataclass
class TrainSection:
    """How to run: epochs, per-process batch size, precision, distributed options."""

    epochs: int = 90
    batch_size: int = 64  # per process
    global_batch_size: int | None = None  # records per step over all ranks; when set, batch_size = this / ranks
    max_steps: int | None = None  # stop after this many optimizer steps (smoke runs)
    grad_accum: int = 1
    amp: str = "auto"  # auto | none | bf16 | fp16; auto: bf16 on a CUDA GPU with native bf16, else none
    channels_last: bool | str = "auto"  # true | false | auto: true on a CUDA GPU with native bf16
    sync_bn: bool = False
    find_unused_parameters: bool = False
    seed: int = 0
    deterministic: bool = False
    timeout_s: float = 1800.0  # process-group timeout
    log_every: int = 50
    validate: bool = True
    compile: bool | str = False  # torch.compile: true | false | auto (true on a CUDA GPU with native bf16); off as in timm, FFCV, Composer
    ema: bool = False  # keep an exponential moving average of the weights; validate and report it too
    ema_decay: float = 0.9998  # per optimizer step
    mixup_alpha: float = 0.0  # > 0: mix each image with its neighbour in the global batch, lambda ~ Beta(alpha, alpha)
    cutmix_alpha: float = 0.0  # > 0: paste a box of the neighbour instead (with mixup too: either, per sample)
    target_top1: float | None = None  # stop once the validated top-1 (of the weights or their EMA) reaches it


@dataclass
class OutputConfig:
    """Where the run writes config.yaml, metrics.jsonl, TensorBoard events and checkpoints."""

    dir: str = "runs/imgpipe"
    checkpoint_every_steps: int = 0  # 0 = only at epoch ends (see checkpoint_every_epochs)
    checkpoint_every_epochs: int = 1
    resume: str = "no"  # no | auto (resume when a checkpoint exists) | yes (must exist)
    overwrite: bool = False  # start afresh in a dir that holds a checkpoint (no: refused, so that a rerun never destroys a run)
    tensorboard: bool = True


@dataclass
class TrainConfig:
    """The whole configuration of one training run."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainSection = field(default_factory=TrainSection)
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)


CHOICES = {
    "data.backend": ("torch", "dali", "synthetic"),
    "optim.schedule": ("cosine", "step", "linear_ramp"),
    "train.amp": ("auto", "none", "bf16", "fp16"),
    "output.resume": ("no", "auto", "yes"),
}


def default_yaml() -> str:
    """The defaults, as YAML (what ``--print-config`` shows)."""
    return TrainConfig().to_yaml()


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (), recipe: str | None = None) -> TrainConfig:
    """Start from the defaults, or from recipe ``recipe`` (``imgpipe.train.recipe``); the file ``path``
    overrides it key by key, then ``section.key=value`` overrides; validate. An empty section
    (``data:`` with every key commented out, which YAML reads as null) overrides nothing."""
    raw: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if recipe:
        from imgpipe.train.recipe import read_recipe

        raw = read_recipe(recipe)
        origins = {f"{section}.{key}": f"recipe {recipe}" for section, values in raw.items() if isinstance(values, dict) for key in values}
    if path:
        for section, values in read_yaml(path).items():
            values = {} if values is None else values
            if isinstance(values, dict) and isinstance(raw.get(section), dict):
                raw[section].update(values)
                for key in values:
                    origins.pop(f"{section}.{key}", None)
            else:
                raw[section] = values
                origins = {dotted: item for dotted, item in origins.items() if dotted.split(".")[0] != section}
    where = str(path) if path else f"recipe {recipe}" if recipe else "<defaults>"
    origins.update({apply_override(raw, item): f"--set {item}" for item in overrides})
    return from_dict(raw, where, origins)


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A config file's raw mapping of sections (empty for an empty file); its mistakes are one line naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file in UTF-8 (byte {e.start}); give a YAML config file") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (data, model, optim, train, output)")
    return loaded or {}


def apply_override(raw: dict[str, Any], item: str) -> str:
    """Apply one ``section.key=value`` (value parsed with yaml.safe_load) to a raw config dict; return ``section.key``."""
    key, sep, value = item.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. train.batch_size=128")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    target = raw.setdefault(section, {})
    if not isinstance(target, dict):
        raise ConfigError(f"--set {item!r}: section {section!r} is not a mapping")
    target[name] = parsed
    return f"{section}.{name}"


def from_dict(raw: Mapping[str, Any], where: str = "<config>", origins: Mapping[str, str] | None = None) -> TrainConfig:
    """Build a TrainConfig from plain data, naming any unknown or mistyped key.

    ``origins`` maps ``section.key`` to the ``--set`` item that gave it: an error about that key
    names the item rather than the file ``where``.
    """
    blame = _Blame(where, origins or {})
    config = TrainConfig()
    sections = {f.name: f for f in fields(TrainConfig)}
    for section, values in raw.items():
        if section not in sections:
            raise ConfigError(f"{blame(str(section))}: unknown section {section!r}{_suggest(str(section), sections)}")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{blame(str(section))}: section {section!r} must be a mapping of keys")
        target = getattr(config, section)
        hints = typing.get_type_hints(type(target))
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(
                    f"{blame(f'{section}.{key}')}: unknown key '{section}.{key}'{_suggest(str(key), list(hints), prefix=f'{section}.')}"
                )
            setattr(target, key, _coerce(value, hints[key], f"{section}.{key}", blame(f"{section}.{key}")))
    validate(config, where, origins)
    return config


class _Blame:
    """Where a key's value came from: its ``--set`` item, else the config file."""

    def __init__(self, where: str, origins: Mapping[str, str]) -> None:
        self.where, self.origins = where, origins

    def __call__(self, key: str) -> str:
        if key in self.origins:
            return self.origins[key]
        return next((item for dotted, item in self.origins.items() if dotted.split(".")[0] == key), self.where)


def validate(config: TrainConfig, where: str = "<config>", origins: Mapping[str, str] | None = None) -> None:
    """Check choices and ranges; every message names the key, and the ``--set`` item that gave it (see from_dict)."""
    blame = _Blame(where, origins or {})
    for dotted, allowed in CHOICES.items():
        section, key = dotted.split(".")
        value = getattr(getattr(config, section), key)
        if value not in allowed:
            raise ConfigError(f"{blame(dotted)}: {dotted} must be one of {', '.join(allowed)}, got {value!r}")
    for key in ("channels_last", "compile"):
        value = getattr(config.train, key)
        if value not in (True, False, "auto"):
            raise ConfigError(f"{blame(f'train.{key}')}: train.{key} must be true, false or auto, got {value!r}")
    positive = {
        "data.image_size": config.data.image_size,
        "data.prefetch_factor": config.data.prefetch_factor,
        "train.epochs": config.train.epochs,
        "train.batch_size": config.train.batch_size,
        "train.grad_accum": config.train.grad_accum,
        "train.timeout_s": config.train.timeout_s,
        "train.log_every": config.train.log_every,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{blame(key)}: {key} must be > 0, got {value}")
    for key, value in {
        "data.workers": config.data.workers,
        "optim.base_lr": config.optim.base_lr,
        "optim.momentum": config.optim.momentum,
        "optim.weight_decay": config.optim.weight_decay,
        "optim.bn_weight_decay": config.optim.bn_weight_decay,
        "optim.lr_peak_epoch": config.optim.lr_peak_epoch,
        "train.mixup_alpha": config.train.mixup_alpha,
        "train.cutmix_alpha": config.train.cutmix_alpha,
        "optim.step_gamma": config.optim.step_gamma,
        "optim.warmup_epochs": config.optim.warmup_epochs,
        "output.checkpoint_every_steps": config.output.checkpoint_every_steps,
        "output.checkpoint_every_epochs": config.output.checkpoint_every_epochs,
    }.items():
        if value is not None and value < 0:
            raise ConfigError(f"{blame(key)}: {key} must be >= 0, got {value}")
    if config.train.global_batch_size is not None and config.train.global_batch_size <= 0:
        raise ConfigError(
            f"{blame('train.global_batch_size')}: train.global_batch_size must be > 0 or null, got {config.train.global_batch_size}"
        )
    if config.train.max_steps is not None and config.train.max_steps <= 0:
        raise ConfigError(f"{blame('train.max_steps')}: train.max_steps must be > 0 or null, got {config.train.max_steps}")
    if config.optim.momentum >= 1.0:
        raise ConfigError(f"{blame('optim.momentum')}: optim.momentum must be in [0, 1), got {config.optim.momentum}")
    if not 0.0 <= config.optim.label_smoothing < 1.0:
        raise ConfigError(f"{blame('optim.label_smoothing')}: optim.label_smoothing must be in [0, 1), got {config.optim.label_smoothing}")
    if config.output.overwrite and config.output.resume != "no":
        raise ConfigError(
            f"{blame('output.overwrite')}: output.overwrite starts the run afresh but output.resume is {config.output.resume!r}: "
            "give --resume to continue the run in output.dir, or --overwrite to start it again, not both"
        )
    if not 0 <= config.train.seed <= MAX_SEED:
        raise ConfigError(f"{blame('train.seed')}: train.seed must be from 0 to {MAX_SEED}, got {config.train.seed}")
    if config.data.cache and config.data.path and not is_url(config.data.path):
        raise ConfigError(
            f"{blame('data.cache')}: data.cache keeps a dataset read from a URL on this node; "
            f"data.path {config.data.path} is read where it is: "
            "unset data.cache"
        )
    if config.data.cache and config.data.stage:
        raise ConfigError(
            f"{blame('data.cache')}: data.cache and data.stage both set: stage copies the whole dataset "
            "before training, the cache fills as it trains; give one"
        )
    if config.data.stage:
        if is_url(config.data.stage):
            raise ConfigError(
                f"{blame('data.stage')}: data.stage must be a folder on each node's disk, not a URL "
                f"({config.data.stage}); the URL goes in data.path"
            )
        if not config.data.path:
            raise ConfigError(f"{blame('data.stage')}: data.stage needs data.path, the dataset to copy there")
        if os.path.abspath(config.data.stage) == (config.data.path if is_url(config.data.path) else os.path.abspath(config.data.path)):
            raise ConfigError(
                f"{blame('data.stage')}: data.stage is data.path itself; give another folder, or leave data.stage empty to read data.path"
            )
    if config.model.num_classes is not None and config.model.num_classes < 2:
        raise ConfigError(f"{blame('model.num_classes')}: model.num_classes must be >= 2 or null (taken from the manifest)")
    _validate_time_to_accuracy(config, blame)


def _validate_time_to_accuracy(config: TrainConfig, blame: _Blame) -> None:
    """The progressive-resizing, evaluation and recipe keys (issue 21's), each refused in one line."""
    try:
        parse_resolution(config.data.resolution, config.data.image_size)
    except ConfigError as e:
        raise ConfigError(f"{blame('data.resolution')}: {e}") from None
    if config.data.val_image_size is not None and config.data.val_image_size <= 0:
        raise ConfigError(
            f"{blame('data.val_image_size')}: data.val_image_size must be > 0 or null (data.image_size), got {config.data.val_image_size}"
        )
    if not 0.0 < config.data.val_crop_ratio <= 1.0:
        raise ConfigError(
            f"{blame('data.val_crop_ratio')}: data.val_crop_ratio must be in (0, 1], such as "
            f"224/256 = 0.875, got {config.data.val_crop_ratio}"
        )
    optim = config.optim
    if optim.schedule == "linear_ramp":
        if optim.warmup_epochs:
            raise ConfigError(
                f"{blame('optim.warmup_epochs')}: optim.warmup_epochs {optim.warmup_epochs:g} with optim.schedule linear_ramp, which ramps "
                "up to optim.lr_peak_epoch by itself: unset optim.warmup_epochs, or choose schedule cosine or step"
            )
        if optim.lr_peak_epoch >= config.train.epochs:
            raise ConfigError(
                f"{blame('optim.lr_peak_epoch')}: optim.lr_peak_epoch {optim.lr_peak_epoch:g} must come before the last epoch "
                f"(train.epochs {config.train.epochs})"
            )
    if not 0.0 < config.train.ema_decay < 1.0:
        raise ConfigError(f"{blame('train.ema_decay')}: train.ema_decay must be in (0, 1), such as 0.9998, got {config.train.ema_decay}")
    target = config.train.target_top1
    if target is not None and not 0.0 < target <= 1.0:
        raise ConfigError(
            f"{blame('train.target_top1')}: train.target_top1 must be a top-1 accuracy in (0, 1], such as 0.738, or null, got {target}"
        )
    if target is not None and not config.train.validate:
        raise ConfigError(
            f"{blame('train.target_top1')}: train.target_top1 is checked against the validation: "
            "set train.validate: true, or target_top1: null"
        )


def make_output_dir(config: TrainConfig) -> Path:
    """Create ``output.dir`` now, so that a path that cannot be a folder fails before any data is opened."""
    folder = Path(config.output.dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"output.dir {folder}: is a file, not a folder; choose another output.dir") from None
    except OSError as e:
        raise ConfigError(f"output.dir {folder}: cannot create it ({e.strerror}); choose another output.dir") from None
    refused = write_probe(folder)
    if refused is not None:
        raise ConfigError(f"output.dir {folder}: cannot write there: {describe(refused, writing=True)}; or choose another output.dir")
    return folder


def save_config(config: TrainConfig, folder: str | os.PathLike) -> Path:
    """Write the resolved config as ``folder/config.yaml`` (atomically).

    ``output.overwrite`` is saved false: it was an action on the folder, and the saved config
    must still resume the run (``--config <dir>/config.yaml --resume``).
    """
    path = Path(folder) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = dataclasses.replace(config, output=dataclasses.replace(config.output, overwrite=False))
    atomic_write_bytes(path, saved.to_yaml().encode("utf-8"))
    return path


def _coerce(value: Any, hint: Any, key: str, where: str) -> Any:
    if hint is Any:  # checked by validate(), which knows the forms it takes
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # e.g. bool | str: true, false or a word such as auto
        if any(isinstance(value, arm) and not (arm in (int, float) and isinstance(value, bool)) for arm in args):
            return value
        raise ConfigError(f"{where}: {key} must be {' or '.join(a.__name__ for a in args)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: {key} must be a list, got {value!r}")
        return [_coerce(v, args[0], key, where) for v in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # YAML's .inf and .nan
                raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool) and key == "output.resume":  # YAML reads `resume: yes` as True
            return "yes" if value else "no"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    type_name = getattr(hint, "__name__", str(hint))
    raise ConfigError(f"{where}: {key} must be {type_name}, got {value!r}")


def _suggest(name: str, valid: Any, prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    return f"; valid: {', '.join(prefix + v for v in valid)}"
