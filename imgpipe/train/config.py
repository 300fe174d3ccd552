"""The training configuration: YAML (``yaml.safe_load``) -> pydantic models, ``--set`` overrides, one-line errors.

Sections: ``data``, ``model``, ``optim``, ``train``, ``output``. Types, choices and ranges are the
fields' (strict types, ``extra="forbid"``); what spans keys is a model validator. A mistake is one
ConfigError naming the key, where its value came from and what it must be (the closest valid key for
an unknown one). ``default_yaml()`` is what ``imgpipe train --print-config`` prints.
"""

from __future__ import annotations

import difflib
import logging
import os
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from imgpipe._sys.atomic import atomic_write_bytes
from imgpipe._sys.validate import MAX_SEED
from imgpipe.errors import ConfigError
from imgpipe.storage.source import is_url
from imgpipe.train.resolution import parse_resolution

logger = logging.getLogger(__name__)

DEFAULT_WARMUP_EPOCHS = 5.0  # before cosine and step (Goyal et al.'s gradual warm-up)
Auto = bool | Literal["auto"]  # true, false, or decided on the device (see precision.py) or by the checkpoint's presence
Text = typing.Annotated[str, Field(strict=False)]  # a path or name; a number such as `--set output.dir=0755` is its text as written
LEGACY_RESUME = {"yes": True, "no": False}  # output.resume's strings in configs and checkpoints written before it was a boolean


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, coerce_numbers_to_str=True)


def _refuse(key: str, detail: str) -> PydanticCustomError:
    """A check over several keys failed: ``detail`` is the message, ``key`` the one to blame."""
    return PydanticCustomError("imgpipe_config", "{detail}", {"key": key, "detail": detail})


class DataConfig(_Section):
    """Where the packed dataset is and how to load it."""

    path: Text = ""  # a packed folder, or its URL
    stage: Text = ""  # a node-local folder: path is copied there once per node (imgpipe stage) and read from there
    cache: Text = ""  # with a URL in data.path: a node-local folder that keeps what is read and ends as the packed folder
    backend: Literal["torch", "dali", "synthetic"] = "torch"  # synthetic: in-memory batches, the compute ceiling
    workers: int | None = Field(None, ge=0)  # None: the loader's default, the CPUs per local rank (at most 8)
    prefetch_factor: int = Field(2, gt=0)  # torch backend: batches queued per worker; from a URL it fetches all but one ahead
    image_size: int = Field(224, gt=0)  # the training size when data.resolution is absent
    # progressive resizing: {start_px, end_px, start_ramp, end_ramp} (epochs; the sizes inside the ramp
    # rounded to a multiple of 32, as FFCV's), or one size per epoch (the last holds after the list)
    resolution: Any = None
    val_image_size: int | None = Field(None, gt=0)  # the validation size (FixRes: above the training size); null: data.image_size
    val_crop_ratio: float = Field(0.875, gt=0, le=1, description="such as 224/256 = 0.875")  # the center crop's share of the shorter side
    val_flip_tta: bool = False  # validate on the mean logits of each image and its mirror
    train_split: Text = "train"
    val_split: Text = "val"

    @property
    def location(self) -> str:
        """Where the loaders read: the staged copy when there is one, else ``path``."""
        return self.stage or self.path

    @field_validator("resolution")
    @classmethod
    def _resolution(cls, value: Any) -> Any:
        try:
            parse_resolution(value, 1)
        except ConfigError as e:
            raise _refuse("data.resolution", str(e)) from None
        return value

    @model_validator(mode="after")
    def _where(self) -> DataConfig:
        if self.cache and self.path and not is_url(self.path):
            raise _refuse(
                "data.cache",
                f"data.cache keeps a dataset read from a URL on this node; data.path {self.path} is read where it is: unset data.cache",
            )
        if self.cache and self.stage:
            raise _refuse(
                "data.cache",
                "data.cache and data.stage both set: stage copies the whole dataset before training, "
                "the cache fills as it trains; give one",
            )
        if not self.stage:
            return self
        if is_url(self.stage):
            raise _refuse(
                "data.stage", f"data.stage must be a folder on each node's disk, not a URL ({self.stage}); the URL goes in data.path"
            )
        if not self.path:
            raise _refuse("data.stage", "data.stage needs data.path, the dataset to copy there")
        if os.path.abspath(self.stage) == (self.path if is_url(self.path) else os.path.abspath(self.path)):
            raise _refuse("data.stage", "data.stage is data.path itself; give another folder, or leave data.stage empty to read data.path")
        return self


class ModelConfig(_Section):
    """Any torchvision classification model, or timm's as ``timm:NAME``; num_classes comes from the manifest unless set."""

    name: Text = "resnet50"
    num_classes: int | None = Field(None, ge=2)
    blurpool: bool = False  # an anti-aliasing blur before every strided convolution, as FFCV's BlurPoolConv2d


class OptimConfig(_Section):
    """SGD; lr = base_lr * global_batch / 256; BatchNorm and bias parameters decay by bn_weight_decay."""

    base_lr: float = Field(0.1, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = True
    weight_decay: float = Field(1e-4, ge=0)
    bn_weight_decay: float = Field(0.0, ge=0)  # of BatchNorm weights and biases and of biases (parameters of one dimension)
    warmup_epochs: float | None = Field(None, ge=0)  # null: 5 before cosine or step; none before linear_ramp, whose ramp is its warm-up
    schedule: Literal["cosine", "step", "linear_ramp"] = "cosine"  # linear_ramp: FFCV's cyclic, from 0 up to the peak, then down to 0
    lr_peak_epoch: float = Field(2.0, ge=0)  # linear_ramp: the epoch of the peak
    step_epochs: list[int] = Field(default_factory=lambda: [30, 60, 80])
    step_gamma: float = Field(0.1, ge=0)
    label_smoothing: float = Field(0.1, ge=0, lt=1)

    @property
    def warmup(self) -> float:
        """The warm-up in epochs: ``warmup_epochs``, else the schedule's (FFCV's linear_ramp has none of its own)."""
        if self.warmup_epochs is not None:
            return self.warmup_epochs
        return 0.0 if self.schedule == "linear_ramp" else DEFAULT_WARMUP_EPOCHS

    @model_validator(mode="after")
    def _no_second_warmup(self) -> OptimConfig:
        if self.schedule == "linear_ramp" and self.warmup_epochs:
            raise _refuse(
                "optim.warmup_epochs",
                f"optim.warmup_epochs {self.warmup_epochs:g} with optim.schedule linear_ramp, which ramps up to optim.lr_peak_epoch "
                "by itself: unset optim.warmup_epochs, or choose schedule cosine or step",
            )
        return self


with warnings.catch_warnings():  # the key train.validate shadows BaseModel's deprecated classmethod validate(), never called here
    warnings.filterwarnings("ignore", message='Field name "validate"', category=UserWarning)

    class TrainSection(_Section):
        """How to run: epochs, per-process batch size, precision, distributed options."""

        epochs: int = Field(90, gt=0)
        batch_size: int = Field(64, gt=0)  # per process
        global_batch_size: int | None = Field(None, gt=0)  # records per step over all ranks; when set, batch_size = this / ranks
        max_steps: int | None = Field(None, gt=0)  # stop after this many optimizer steps (smoke runs)
        grad_accum: int = Field(1, gt=0)
        amp: Literal["auto", "none", "bf16", "fp16"] = "auto"  # auto: bf16 on a CUDA GPU with native bf16, else none
        channels_last: Auto = "auto"  # auto: true on a CUDA GPU with native bf16
        sync_bn: bool = False
        find_unused_parameters: bool = False
        seed: int = Field(0, ge=0, le=MAX_SEED)
        deterministic: bool = False
        timeout_s: float = Field(1800.0, gt=0)  # process-group timeout
        log_every: int = Field(50, gt=0)
        validate: bool = True
        compile: Auto = False  # torch.compile; auto: true on a CUDA GPU with native bf16; off as in timm, FFCV, Composer
        ema: bool = False  # keep an exponential moving average of the weights; validate and report it too
        ema_decay: float = Field(0.9998, gt=0, lt=1, description="such as 0.9998")  # per optimizer step
        mixup_alpha: float = Field(0.0, ge=0)  # > 0: mix each image with its neighbour in the global batch, lambda ~ Beta(alpha, alpha)
        cutmix_alpha: float = Field(0.0, ge=0)  # > 0: paste a box of the neighbour instead (with mixup too: either, per sample)
        # stop once the validated top-1 (of the weights or their EMA) reaches it
        target_top1: float | None = Field(None, gt=0, le=1, description="a top-1 accuracy such as 0.738")

        @model_validator(mode="after")
        def _target_needs_validation(self) -> TrainSection:
            if self.target_top1 is not None and not self.validate:
                raise _refuse(
                    "train.target_top1",
                    "train.target_top1 is checked against the validation: set train.validate: true, or target_top1: null",
                )
            return self


class OutputConfig(_Section):
    """Where the run writes config.yaml, metrics.jsonl, TensorBoard events and checkpoints."""

    dir: Text = "runs/imgpipe"
    checkpoint_every_steps: int = Field(0, ge=0)  # 0 = only at epoch ends (see checkpoint_every_epochs)
    checkpoint_every_epochs: int = Field(1, ge=0)
    resume: Auto = False  # true: the checkpoint must exist; auto: resume when one exists
    overwrite: bool = False  # start afresh in a dir that holds a checkpoint (false: refused, so that a rerun never destroys a run)
    tensorboard: bool = True

    def resumes(self, checkpoint_exists: bool) -> bool:
        """Whether the run continues from ``<dir>/checkpoint.pt``."""
        return self.resume is True or (self.resume == "auto" and checkpoint_exists)

    @field_validator("resume", mode="before")
    @classmethod
    def _legacy_resume(cls, value: Any) -> Any:
        return LEGACY_RESUME.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _resume_or_overwrite(self) -> OutputConfig:
        if self.overwrite and self.resume is not False:
            raise _refuse(
                "output.overwrite",
                f"output.overwrite starts the run afresh but output.resume is {_scalar(self.resume)}: "
                "give --resume to continue the run in output.dir, or --overwrite to start it again, not both",
            )
        return self


class TrainConfig(BaseModel):
    """The whole configuration of one training run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainSection = Field(default_factory=TrainSection)
    output: OutputConfig = Field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)

    @model_validator(mode="after")
    def _peak_before_the_end(self) -> TrainConfig:
        optim = self.optim
        if optim.schedule == "linear_ramp" and optim.lr_peak_epoch >= self.train.epochs:
            raise _refuse(
                "optim.lr_peak_epoch",
                f"optim.lr_peak_epoch {optim.lr_peak_epoch:g} must come before the last epoch (train.epochs {self.train.epochs})",
            )
        return self


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
    config = from_dict(raw, where, origins)
    output = raw.get("output")
    old = output.get("resume") if isinstance(output, dict) else None
    if isinstance(old, str) and old in LEGACY_RESUME:
        word = _scalar(LEGACY_RESUME[old])
        origin = _origin("output.resume", where, origins)
        logger.warning("%s: output.resume %r is read as %s; write %s (the strings 'yes' and 'no' are deprecated)", origin, old, word, word)
    return config


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A config file's raw mapping of sections (empty for an empty file); its mistakes are one line naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file in UTF-8 (byte {e.start}); give a YAML config file") from None
    try:
        loaded, node = _parse_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (data, model, optim, train, output)")
    for section_node, keys_node in node.value if loaded else ():  # type: ignore[union-attr]  # a number where text goes: its text
        section = loaded.get(section_node.value)
        if isinstance(section, dict) and isinstance(keys_node, yaml.MappingNode):
            for key_node, value_node in keys_node.value:
                if key_node.value in section:
                    section[key_node.value] = _as_text(section_node.value, key_node.value, section[key_node.value], value_node)
    return loaded or {}


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, but a key given twice in one mapping is an error (yaml keeps the last: a whole
    section lost), and a date is its text (no key takes a date; 2024-13-45 raised ValueError)."""

    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}  # key -> the line it is on
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merged key may be overridden
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                continue  # yaml's own error
            if key in lines:
                twice = f"key {key!r} given twice: lines {lines[key]} and {key_node.start_mark.line + 1}"
                raise yaml.constructor.ConstructorError(problem=twice)
            lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _parse_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """The value of the YAML ``text`` and its node (for the text of its scalars); a yaml.YAMLError for anything
    it cannot be (a RecursionError or int()'s ValueError from yaml alone)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return (None if node is None else loader.construct_document(node)), node
    except RecursionError:
        raise yaml.YAMLError("nested too deep") from None
    except ValueError as e:
        raise yaml.YAMLError("a number of thousands of digits" if str(e).startswith("Exceeds the limit") else str(e)) from None
    finally:
        loader.dispose()


def _as_text(section: str, key: str, value: Any, node: yaml.Node | None) -> Any:
    """``value``, or where ``section.key`` takes text (a path, a name) and YAML read a number, the number's text as
    written (0755, 1.50, 12:30: not 493, 1.5 and 750)."""
    number = isinstance(node, yaml.ScalarNode) and node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    model = TrainConfig.model_fields[section].annotation if section in TrainConfig.model_fields else None
    field = model.model_fields.get(key) if model is not None else None
    return node.value if number and field is not None and field.annotation is str else value  # type: ignore[union-attr]


def apply_override(raw: dict[str, Any], item: str) -> str:
    """Apply one ``section.key=value`` (the value read as YAML, as in a file) to a raw config dict; return ``section.key``."""
    key, sep, value = item.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. train.batch_size=128")
    try:
        parsed = _as_text(section, name, *_parse_yaml(value)) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    target = raw.setdefault(section, {})
    if not isinstance(target, dict):
        raise ConfigError(f"--set {item!r}: section {section!r} is not a mapping")
    target[name] = parsed
    return f"{section}.{name}"


def from_dict(raw: Mapping[str, Any], where: str = "<config>", origins: Mapping[str, str] | None = None) -> TrainConfig:
    """Validate plain data (a null section is an empty one) into a TrainConfig, or one ConfigError.

    ``origins`` maps ``section.key`` to where its value came from (a ``--set`` item, a recipe):
    an error about that key names it rather than ``where``. A YAML key that is no string (``1:``) is
    named as its text.
    """
    sections = {
        str(section): {str(key): value for key, value in values.items()} if isinstance(values, dict) else values
        for section, values in raw.items()
        if values is not None
    }
    try:
        return TrainConfig.model_validate(sections)
    except ValidationError as e:
        raise _config_error(e.errors()[0], sections, lambda key: _origin(key, where, origins or {})) from None


def _origin(key: str, where: str, origins: Mapping[str, str]) -> str:
    """Where ``key`` (``section.key``, or a section) got its value: its origin, one of its section's, else ``where``."""
    if key in origins:
        return origins[key]
    return next((item for dotted, item in origins.items() if dotted.split(".")[0] == key), where)


def _config_error(error: Mapping[str, Any], raw: Mapping[str, Any], origin: Callable[[str], str]) -> ConfigError:
    """One line for pydantic's first error: the origin, the dotted key, and what its value must be."""
    if error["type"] == "imgpipe_config":
        return ConfigError(f"{origin(error['ctx']['key'])}: {error['ctx']['detail']}")
    section, *rest = (str(part) for part in error["loc"])
    if not rest:
        if error["type"] == "extra_forbidden":
            return ConfigError(f"{origin(section)}: unknown section {section!r}{_suggest(section, TrainConfig.model_fields)}")
        return ConfigError(f"{origin(section)}: section {section!r} must be a mapping of keys")
    key = f"{section}.{rest[0]}"
    fields = TrainConfig.model_fields[section].annotation.model_fields
    if error["type"] == "extra_forbidden":
        return ConfigError(f"{origin(key)}: unknown key '{key}'{_suggest(rest[0], fields, prefix=f'{section}.')}")
    value = raw[section].get(rest[0], error["input"])
    return ConfigError(f"{origin(key)}: {key} must be {_needs(fields[rest[0]], error['type'])}, got {value!r}")


def _needs(field: FieldInfo, error_type: str) -> str:
    """What a field takes, in words: its range when the value broke it, else its type."""
    if error_type == "finite_number":
        return "a finite number"
    words = _type_words(field.annotation)
    if error_type in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        words = [_range(field)] + (["null"] if "null" in words else [])
    needs = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
    return f"{needs} ({field.description})" if field.description else needs


def _type_words(annotation: Any) -> list[str]:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return [str(choice) for choice in typing.get_args(annotation)]
    if origin in (typing.Union, types.UnionType):
        return [word for arm in typing.get_args(annotation) for word in _type_words(arm)]
    if origin is list:
        return ["a list of integers"]
    return {bool: ["true", "false"], int: ["an integer"], float: ["a number"], str: ["a string"], type(None): ["null"]}[annotation]


def _range(field: FieldInfo) -> str:
    """A field's bounds: ``> 0``, ``in [0, 1)``, or ``from 0 to N`` for a closed range of integers."""
    bounds = {name: getattr(item, name) for item in field.metadata for name in ("gt", "ge", "lt", "le") if hasattr(item, name)}
    low = ("(", bounds["gt"]) if "gt" in bounds else ("[", bounds["ge"]) if "ge" in bounds else None
    high = (")", bounds["lt"]) if "lt" in bounds else ("]", bounds["le"]) if "le" in bounds else None
    if low and high:
        if (low[0], high[0]) == ("[", "]") and "an integer" in _type_words(field.annotation):
            return f"from {low[1]} to {high[1]}"
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    return f"{'<' if high[0] == ')' else '<='} {high[1]}"


def _scalar(value: Any) -> str:
    """A config value as YAML writes it: true, false, auto."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _suggest(name: str, valid: Any, prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    return f"; valid: {', '.join(prefix + v for v in valid)}"


def save_config(config: TrainConfig, folder: str | os.PathLike) -> Path:
    """Write the resolved config as ``folder/config.yaml`` (atomically).

    ``output.overwrite`` is saved false: it was an action on the folder, and the saved config
    must still resume the run (``--config <dir>/config.yaml --resume``).
    """
    path = Path(folder) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = config.model_copy(update={"output": config.output.model_copy(update={"overwrite": False})})
    atomic_write_bytes(path, saved.to_yaml().encode("utf-8"))
    return path
