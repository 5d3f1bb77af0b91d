"""Loading the policy (and the reference policy) so that no rank ever holds more than its share.

    load_for_backend(model_dir, settings, device)   the policy, built for the backend that trains it

- **ZeRO-3**: the model is built inside `deepspeed.zero.Init` — each parameter is partitioned
  over the ranks as soon as its module is constructed, in the training precision — and then each
  rank reads **its own partition** of every parameter straight from the safetensors files
  (`read_partitions`: exactly the partition's bytes, with `pread`, no memory map). No rank
  materialises a parameter it does not own, no collective is needed, and the bytes a rank reads
  are its share of the model; `deepspeed.zero.Init` allocates each module's parameters whole for
  a moment before partitioning them (one module at a time: at most the embedding matrix).
- **ZeRO-1/2** keep a full copy of the compute weights on every rank by design (only gradients
  and optimizer state are partitioned): the model is loaded directly in the training precision
  (bfloat16 with `precision: bf16`; DeepSpeed's bf16 optimizer derives its float32 master
  partitions from those weights, as it did from a float32 model cast down), never float32 first.
- **torch** (one process): float32, the master weights of bf16 training come from it.

The DeepSpeed partition layout relied on (`deepspeed.runtime.zero.partition_parameters`): a
partitioned parameter `p` keeps `p.ds_tensor`, a 1-D tensor of `p.ds_tensor.ds_numel`
elements; rank r's partition is the flattened parameter's elements [r·n, (r+1)·n), the last
one zero-padded. `tests/integration/test_learner_sharded_load.py` checks the loaded partitions
against the gathered full model and measures every rank's peak memory.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch

from magic import modeling


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
           "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class SafetensorsFile:
    """Ranged reads of a safetensors file with plain `pread` (no memory map): what a rank reads is
    all it holds (a memory map would add every page it touched to its resident memory)."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > 100 * 2**20:
                raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
        self.data_start = 8 + n
        header.pop("__metadata__", None)
        self.tensors: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            if info["dtype"] not in _DTYPES:
                raise ValueError(f"{path}: {name} has dtype {info['dtype']}, which the loader does not read")
            start, stop = info["data_offsets"]
            self.tensors[name] = (_DTYPES[info["dtype"]], tuple(info["shape"]), start, stop)

    def keys(self) -> list[str]:
        return list(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name][1]

    def read_flat(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of the flattened tensor `name`, reading only those bytes."""
        dtype, _shape, begin, _end = self.tensors[name]
        item = torch.empty((), dtype=dtype).element_size()
        count = max(0, stop - start)
        buf = bytearray(count * item)
        if count:
            with open(self.path, "rb", buffering=0) as f:
                view, offset, got = memoryview(buf), self.data_start + begin + start * item, 0
                while got < len(buf):
                    n = os.preadv(f.fileno(), [view[got:]], offset + got)
                    if n <= 0:
                        raise ValueError(f"{self.path}: {name} is cut short")
                    got += n
        return torch.frombuffer(buf, dtype=dtype) if count else torch.empty(0, dtype=dtype)

    def read(self, name: str) -> torch.Tensor:
        dtype, shape, _b, _e = self.tensors[name]
        return self.read_flat(name, 0, math.prod(shape)).reshape(shape)


def safetensors_index(model_dir: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or sharded with an index)."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: root / file for name, file in weight_map.items()}
    single = root / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{root}: no model.safetensors (or model.safetensors.index.json): the sharded load reads safetensors weights only")
    return {name: single for name in SafetensorsFile(single).keys()}


def _file_name(param_name: str, files: dict[str, Path], prefix: str | None) -> str:
    if param_name in files:
        return param_name
    if prefix and param_name.startswith(prefix + ".") and param_name[len(prefix) + 1 :] in files:
        return param_name[len(prefix) + 1 :]
    raise KeyError(param_name)


@torch.no_grad()
def read_partitions(model: torch.nn.Module, model_dir: str | Path) -> None:
    """Fill every ZeRO-3-partitioned parameter's local partition (and every buffer) of `model`
    from the safetensors files of `model_dir`, each rank reading only its own share."""
    rank = torch.distributed.get_rank()
    files = safetensors_index(model_dir)
    prefix = getattr(model, "base_model_prefix", None)
    wanted: dict[Path, list[tuple[str, torch.nn.Parameter]]] = {}
    missing = []
    for name, p in model.named_parameters():
        try:
            key = _file_name(name, files, prefix)
        except KeyError:
            missing.append(name)
            continue
        wanted.setdefault(files[key], []).append((key, p))
    if missing:
        raise ValueError(f"{model_dir}: the weights files lack {len(missing)} of the model's parameters (first: {missing[:3]}): they do not match its config.json")
    for path, params in wanted.items():
        f = SafetensorsFile(path)
        for key, p in params:
            shape = f.shape(key)
            if shape != tuple(p.ds_shape):
                raise ValueError(f"{path.name}: {key} has shape {list(shape)}, the model's config.json makes it {list(p.ds_shape)}")
            part = p.ds_tensor
            n = part.ds_numel
            start = min(rank * n, p.ds_numel)
            stop = min(start + n, p.ds_numel)
            part.data[: stop - start].copy_(f.read_flat(key, start, stop).to(part.dtype))
            part.data[stop - start :].zero_()
    buffers = {n: b for n, b in model.named_buffers() if b is not None}
    for name, buf in buffers.items():  # buffers are not partitioned (e.g. rotary frequencies): whole on every rank
        try:
            key = _file_name(name, files, prefix)
        except KeyError:
            continue  # computed at construction, not stored
        buf.copy_(SafetensorsFile(files[key]).read(key).to(buf.dtype))


def zero3_init_config(zero_config: dict, dtype: torch.dtype) -> dict:
    """The DeepSpeed config `deepspeed.zero.Init` needs to partition at construction like the engine will."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": dict(zero_config),
        "bf16": {"enabled": dtype == torch.bfloat16},
    }


def _partition_only():
    import deepspeed

    class PartitionOnly(deepspeed.zero.Init):
        """`deepspeed.zero.Init` without its broadcast of every parameter from rank 0 before
        partitioning it (`Init._zero_init_param`, DeepSpeed 0.19): the values are read from the
        files right after, so the broadcast would move the whole model for nothing and make each
        rank hold every parameter whole for a moment."""

        def _zero_init_param(self, param):
            self._convert_to_deepspeed_param(param)
            param.partition()

    return PartitionOnly


def build_partitioned(model_dir: str | Path, ds_config: dict, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The model of `model_dir` partitioned under ZeRO-3 from its construction, in `dtype`, with
    each rank's partitions read from the safetensors files (`read_partitions`)."""
    from transformers import AutoModelForCausalLM

    import torch._dynamo  # noqa: F401 — imported inside zero.Init (which patches tensor creation) it fails

    _PartitionOnly = _partition_only()
    from transformers.initialization import no_init_weights
    from transformers.models.auto.auto_factory import _get_model_class

    config = modeling.load_model_config(model_dir)
    # the config.json decides the architecture; the weights files must match it (checked per tensor)
    model_class = _get_model_class(config, AutoModelForCausalLM._model_mapping)  # its module imported outside zero.Init too
    # no random initialisation: every value is read from the files (and HF's init cannot index a
    # partition). The partitions' dtype comes from ds_config's "bf16" (zero.Init's own `dtype`
    # argument turns float32 into bfloat16 on accelerators without float16, such as the CPU).
    with no_init_weights(), _PartitionOnly(config_dict_or_path=ds_config, remote_device=None, enabled=True):
        model = model_class._from_config(config, dtype=dtype)
    model.tie_weights()  # tied output embeddings share the input embeddings' partitioned parameter
    read_partitions(model, model_dir)
    return _with_generation_config(model, model_dir).eval()


def _with_generation_config(model: torch.nn.Module, model_dir: str | Path) -> torch.nn.Module:
    """The model directory's generation config (EOS ids, sampling defaults), as from_pretrained sets it."""
    if (Path(model_dir) / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(str(model_dir))
    return model


def load_dense(model_dir: str | Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The whole model on `device` in `dtype` (the ZeRO-1/2 replica): built there uninitialised,
    then filled one tensor at a time from the safetensors files, each converted as it is read —
    never the whole model in the files' dtype (float32) on the host or the device."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.models.auto.auto_factory import _get_model_class

    try:
        files = safetensors_index(model_dir)
    except FileNotFoundError:  # another weights format: transformers' own loader
        return modeling.load_model(model_dir, device, dtype=dtype)
    config = modeling.load_model_config(model_dir)
    model_class = _get_model_class(config, AutoModelForCausalLM._model_mapping)
    with no_init_weights(), torch.device(device):
        model = model_class._from_config(config, dtype=dtype)
    model.tie_weights()
    prefix = getattr(model, "base_model_prefix", None)
    opened: dict[Path, SafetensorsFile] = {}
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if b is not None)]:
            try:
                key = _file_name(name, files, prefix)
            except KeyError:
                if isinstance(t, torch.nn.Parameter):
                    raise ValueError(f"{model_dir}: the weights files lack {name}: they do not match config.json") from None
                continue  # a buffer computed at construction
            f = opened.setdefault(files[key], SafetensorsFile(files[key]))
            if f.shape(key) != tuple(t.shape):
                raise ValueError(f"{files[key].name}: {key} has shape {list(f.shape(key))}, config.json makes it {list(t.shape)}")
            t.copy_(f.read(key).to(t.dtype))
    return _with_generation_config(model, model_dir).eval()


def check_files(model_dir: str | Path) -> None:
    """Raise ValueError naming the first mismatches when the safetensors files of `model_dir` do not
    match the model its config.json describes (a missing, extra or differently shaped tensor),
    reading only the files' headers and building the model on the meta device."""
    from transformers import AutoModelForCausalLM

    try:
        files = safetensors_index(model_dir)
    except FileNotFoundError:
        return  # weights in another format (pytorch_model.bin): transformers checks them as it loads
    config = modeling.load_model_config(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied output embeddings once
    prefix = getattr(model, "base_model_prefix", None)
    ignored = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []) + [r"rotary_emb\.inv_freq$"]
    problems = []
    found: set[str] = set()
    by_file: dict[Path, list[str]] = {}
    for key, path in files.items():
        by_file.setdefault(path, []).append(key)
    for path, names in by_file.items():
        f = SafetensorsFile(path)
        for key in names:
            name = key if key in expected else f"{prefix}.{key}" if prefix and f"{prefix}.{key}" in expected else None
            if name is None:
                tied = key == "lm_head.weight" and getattr(config, "tie_word_embeddings", False)
                if not tied and not any(re.search(p, key) for p in ignored):  # what transformers ignores too (e.g. stored rotary inv_freq)
                    problems.append(f"{key}: not a parameter of the model")
                continue
            found.add(name)
            if f.shape(key) != expected[name]:
                problems.append(f"{key}: shape {list(f.shape(key))}, config.json makes it {list(expected[name])}")
    problems += [f"{n}: missing from the weights files" for n in expected if n not in found]
    if problems:
        raise ValueError(f"{model_dir}: the weights do not match config.json ({len(problems)} problems; first: {'; '.join(problems[:3])})")
