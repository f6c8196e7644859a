"""PyTorch's view of a localpar model: the nn.Module of a job's network, and the loader of
a safetensors export into it.

    import localpar_torch                                   # python/ on sys.path
    model = localpar_torch.load("model.safetensors")        # or a folder of shards
    logits = model(x)  # images [N, C, H, W] as ToTensor() gives them; token ids [N, T]

`load` reads the export (one file, or a folder with model.safetensors.index.json), builds
the network of the job the file carries, loads the tensors with strict=True, applies the
training's input normalisation inside forward, and returns it in eval mode. It needs
PyTorch, python3-protobuf and protoc (the job is parsed with proto/job.proto); the file
format is read here, without the safetensors package.

The module's state_dict has the names localpar's safetensors export writes: the layers
numbered through the whole network whatever the split (`layers.7.weight`;
`layers.3.body.0.weight` inside a residual block, whose body is an nn.Sequential), and each
stage's head named by the layer it follows (`heads.7.0.weight`). A transformer block is the
two pre-norm residual blocks localpar builds for it; GELU is the tanh approximation.

    twin, sequence = build(torch, job, classes, input_shape, job_pb2)  # [H, W, C] as localpar's
    twin.stage_modules(), twin.head_modules()   # per stage, for training loops
    twin(x), twin(x, stage=k)                   # the last stage's head, or stage k's
"""
import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import types

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_JOB_PB2 = []


def _modules(torch):
    """The modules localpar's layers become that PyTorch lacks, built on `torch`."""
    nn = torch.nn

    class FlatLinear(nn.Linear):  # localpar's linear: the whole example flattened
        def forward(self, x):
            return super().forward(x.flatten(1))

    class PositionEmbedding(nn.Module):  # a learned vector per position
        def __init__(self, t, d):
            super().__init__()
            self.table = nn.Parameter(torch.randn(t, d) * 0.02)

        def forward(self, x):
            return x + self.table

    class PositionalEncoding(nn.Module):  # fixed sinusoids, as localpar's
        def __init__(self, t, d):
            super().__init__()
            pos = torch.arange(t, dtype=torch.float64)[:, None]
            i = torch.arange(d)
            freq = torch.pow(10000.0, -((i - i % 2).double()) / d)
            pe = torch.where(i % 2 == 0, torch.sin(pos * freq), torch.cos(pos * freq))
            self.register_buffer("pe", pe.float(), persistent=False)

        def forward(self, x):
            return x + self.pe

    class CausalSelfAttention(nn.Module):  # nanoGPT's, without dropout
        def __init__(self, d, heads):
            super().__init__()
            self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            return self.out((att @ v).transpose(1, 2).reshape(b, t, d))

    class Residual(nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = nn.Sequential(*body)

        def forward(self, x):
            return x + self.body(x)

    class GlobalAvgPool(nn.Module):
        def forward(self, x):
            return x.mean(dim=(2, 3))

    class TiedOutput(nn.Module):  # logits from the embedding's own table, and a bias
        def __init__(self, embedding, vocab):
            super().__init__()
            self.tied = [embedding]  # a list: not a submodule, so not in state_dict twice
            self.bias = nn.Parameter(torch.zeros(vocab))

        def forward(self, x):
            return x @ self.tied[0].weight.t() + self.bias

    return types.SimpleNamespace(
        FlatLinear=FlatLinear, PositionEmbedding=PositionEmbedding,
        PositionalEncoding=PositionalEncoding, CausalSelfAttention=CausalSelfAttention,
        Residual=Residual, GlobalAvgPool=GlobalAvgPool, TiedOutput=TiedOutput)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _layer(torch, mods, spec, shape):
    """A layer spec as [modules] and the shape after it; a shape is (C, H, W), (F,), (T,)
    token ids or (T, D)."""
    nn = torch.nn
    kind = spec.WhichOneof("kind")
    if kind == "linear":
        out = spec.linear.out_features
        return [mods.FlatLinear(_numel(shape), out)], (out,)
    if kind == "relu":
        return [nn.ReLU()], shape
    if kind == "gelu":
        return [nn.GELU(approximate="tanh")], shape
    if kind == "dropout":
        return [nn.Dropout(spec.dropout.rate)], shape
    if kind == "flatten":
        return [nn.Flatten()], (_numel(shape),)
    if kind == "conv2d":
        c = spec.conv2d
        k, s, p = c.kernel or 3, c.stride or 1, c.padding
        h = (shape[1] + 2 * p - k) // s + 1
        w = (shape[2] + 2 * p - k) // s + 1
        return [nn.Conv2d(shape[0], c.out_channels, k, s, p)], (c.out_channels, h, w)
    if kind == "batch_norm":
        bn = nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d
        return [bn(shape[0], eps=spec.batch_norm.eps or 1e-5,
                   momentum=spec.batch_norm.momentum or 0.1)], shape
    if kind == "layer_norm":
        return [nn.LayerNorm(shape[-1], eps=spec.layer_norm.eps or 1e-5)], shape
    if kind in ("max_pool", "avg_pool"):
        c = getattr(spec, kind)
        k = c.kernel or 2
        s = c.stride or k
        pool = (nn.MaxPool2d(k, s, c.padding) if kind == "max_pool"
                else nn.AvgPool2d(k, s, c.padding, count_include_pad=True))
        return [pool], (shape[0], (shape[1] + 2 * c.padding - k) // s + 1,
                        (shape[2] + 2 * c.padding - k) // s + 1)
    if kind == "global_avg_pool":
        return [mods.GlobalAvgPool()], (shape[0],)
    if kind == "embedding":
        return [nn.Embedding(spec.embedding.vocab, spec.embedding.dim)], \
            (shape[0], spec.embedding.dim)
    if kind == "position_embedding":
        return [mods.PositionEmbedding(*shape)], shape
    if kind == "positional_encoding":
        return [mods.PositionalEncoding(*shape)], shape
    if kind == "dense":
        return [nn.Linear(shape[-1], spec.dense.out_features)], \
            (*shape[:-1], spec.dense.out_features)
    if kind == "causal_self_attention":
        return [mods.CausalSelfAttention(shape[-1], spec.causal_self_attention.heads or 1)], shape
    if kind == "transformer_block":  # the two pre-norm residual blocks localpar builds
        t, d = spec.transformer_block, shape[-1]
        hidden = t.mlp_hidden or 4 * d
        return [mods.Residual([nn.LayerNorm(d), mods.CausalSelfAttention(d, t.heads or 1)]),
                mods.Residual([nn.LayerNorm(d), nn.Linear(d, hidden),
                               nn.GELU(approximate="tanh"), nn.Linear(hidden, d)])], shape
    if kind == "residual":
        body, cur = [], shape
        for b in spec.residual.body:
            m, cur = _layer(torch, mods, b, cur)
            body.extend(m)
        return [mods.Residual(body)], shape
    raise ValueError(f"localpar_torch: no PyTorch module for layer kind {kind}")


def _head(torch, mods, spec, shape, embedding, classes, job_pb2):
    """A stage's head, common/nn/head.cc's layers, one module each."""
    nn = torch.nn
    kind = job_pb2.Head.Kind.Name(spec.kind)
    image = len(shape) == 3
    if kind == "LANGUAGE_MODEL":
        out = (mods.TiedOutput(embedding, classes) if spec.tie_embedding
               else nn.Linear(shape[-1], classes))
        return nn.Sequential(nn.LayerNorm(shape[-1]), out)
    layers = []
    if kind == "POOL_LINEAR" and image:
        layers, shape = [mods.GlobalAvgPool()], (shape[0],)
    elif kind == "MLP":
        layers, shape = [mods.FlatLinear(_numel(shape), spec.hidden), nn.ReLU()], (spec.hidden,)
    elif kind == "CONV_POOL_LINEAR":
        ch = spec.channels
        layers = [nn.Conv2d(shape[0], ch, 3, 1, 1), nn.ReLU(), mods.GlobalAvgPool()]
        shape = (ch,)
    return nn.Sequential(*layers, mods.FlatLinear(_numel(shape), classes))


def _twin_class(nn):
    """The whole network: its layers in order, each stage's head named by the layer it
    follows, and the bounds of each stage."""
    class Twin(nn.Module):
        def __init__(self, job, shape, layer, head, normalization, tokens):
            super().__init__()
            self.normalization, self.tokens = normalization, tokens
            self.layers = nn.ModuleList()
            self.heads = nn.ModuleDict()
            self.bounds = []  # each stage's [begin, end) in layers
            cur, embedding = shape, None
            for st in job.stages:
                begin = len(self.layers)
                for spec in st.layers:
                    mods, cur = layer(spec, cur)
                    for m in mods:
                        if isinstance(m, nn.Embedding):
                            embedding = m
                        self.layers.append(m)
                self.bounds.append((begin, len(self.layers)))
                name = str(len(self.layers) - 1) if len(self.layers) else "input"
                self.heads[name] = head(st.head, cur, embedding)

        def keep_stages(self, count):
            """Only stages 0..count-1 (an export of stages 0..K has only their tensors)."""
            end = self.bounds[count - 1][1]
            for name in [n for n in self.heads if n not in
                         {str(e - 1) if e else "input" for _, e in self.bounds[:count]}]:
                del self.heads[name]
            self.layers = self.layers[:end]
            self.bounds = self.bounds[:count]

        def stage_modules(self):
            return [nn.Sequential(*self.layers[b:e]) for b, e in self.bounds]

        def head_modules(self):
            return [self.heads[str(e - 1) if e else "input"] for _, e in self.bounds]

        def forward(self, x, stage=None):
            last = len(self.bounds) - 1 if stage is None else stage
            if self.tokens:
                x = x.long()
            elif self.normalization is not None:
                x = (x - self.normalization[0]) * self.normalization[1]
            for m in self.layers[:self.bounds[last][1]]:
                x = m(x)
            return self.head_modules()[last](x)

    return Twin


def build(torch, job, classes, input_shape, job_pb2, normalization=None, tokens=False):
    """The network of `job` (a job_pb2.Job) as an nn.Module, and whether it reads sequences.
    normalization: (mean, inv_std) applied to the input in forward, or None; tokens: the
    input is token ids (cast to int64 in forward)."""
    mods = _modules(torch)
    sequence = len(input_shape) == 1
    shape = tuple(input_shape) if sequence else (
        (input_shape[2], input_shape[0], input_shape[1]) if len(input_shape) == 3
        else tuple(input_shape))
    twin = _twin_class(torch.nn)(
        job, shape, lambda spec, cur: _layer(torch, mods, spec, cur),
        lambda spec, cur, emb: _head(torch, mods, spec, cur, emb, classes, job_pb2),
        normalization, tokens)
    return twin, sequence


def job_pb2():
    """proto/job.proto's Python module, generated by protoc on first use."""
    if not _JOB_PB2:
        protoc = shutil.which("protoc")
        if protoc is None:
            raise RuntimeError("localpar_torch needs protoc (Debian's protobuf-compiler)")
        gen = tempfile.mkdtemp(prefix="localpar_torch_pb.")
        atexit.register(shutil.rmtree, gen, True)
        out = subprocess.run([protoc, "-I", SOURCE, "--python_out", gen, "proto/job.proto",
                              "proto/options.proto"], capture_output=True, text=True, cwd=SOURCE)
        if out.returncode != 0:
            raise RuntimeError(f"protoc failed on {SOURCE}/proto/job.proto: {out.stderr.strip()}")
        sys.path.insert(0, gen)
        from proto import job_pb2 as module
        _JOB_PB2.append(module)
    return _JOB_PB2[0]


def read_safetensors(torch, path):
    """(metadata, {name: tensor}) from one safetensors file, or from a folder of shards
    through its model.safetensors.index.json."""
    if os.path.isdir(path):
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        meta, tensors = None, {}
        for shard in sorted(set(weight_map.values())):
            if os.path.basename(shard) != shard:
                raise ValueError(f"{path}: shard {shard!r} is not a file name beside the index")
            m, t = read_safetensors(torch, os.path.join(path, shard))
            meta = meta or m
            tensors.update(t)
        if set(tensors) != set(weight_map):
            raise ValueError(f"{path}: the shards do not hold what the index names")
        return meta, tensors
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    dtypes = {"F32": torch.float32, "I64": torch.int64, "I32": torch.int32}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if not 0 <= b <= e <= len(body) or info["dtype"] not in dtypes:
            raise ValueError(f"{path}: tensor {name}: bad offsets or dtype {info['dtype']}")
        t = torch.frombuffer(bytearray(body[b:e]), dtype=dtypes[info["dtype"]])
        tensors[name] = t.reshape(info["shape"])
    return header.get("__metadata__", {}), tensors


def load(path):
    """The exported model at `path` (a .safetensors file or a folder of shards) as an
    nn.Module in eval mode, its weights loaded with strict=True. Its forward takes images
    [N, C, H, W] in [0, 1] (pixels as ToTensor() gives them; float data as the training files
    held it) or token ids [N, T], and returns the last stage's logits; forward(x, stage=k)
    stage k's. `model.meta` is the file's metadata, `model.class_names` the class names."""
    import torch
    from google.protobuf import text_format
    meta, tensors = read_safetensors(torch, path)
    if "job" not in meta:
        raise ValueError(f"{path}: no job in its metadata: not an export of localpar's")
    pb = job_pb2()
    job = pb.Job()
    text_format.Parse(meta["job"], job)
    input_shape = json.loads(meta["input_shape"])
    norm = None
    if meta.get("input_tokens") != "true":
        norm = (float(meta["input_mean"]), float(meta["input_inv_std"]))
    model, _ = build(torch, job, int(meta["classes"]), input_shape, pb, norm,
                     tokens=meta.get("input_tokens") == "true")
    # An export of stages 0..K (export --stage=K) holds their layers and heads only.
    heads = {k.split(".")[1] for k in tensors if k.startswith("heads.")}
    names = [str(e - 1) if e else "input" for _, e in model.bounds]
    if heads and heads != set(names):
        count = max(i for i, n in enumerate(names) if n in heads) + 1
        model.keep_stages(count)
    model.load_state_dict(tensors, strict=True)
    model.meta = meta
    model.class_names = json.loads(meta["class_names"]) if meta.get("class_names") else []
    return model.eval()
