"""The zoo: models people deploy, from transformers, timm and torchvision, in small configs with random seeded
weights (nothing is downloaded), each with its dynamic dims and the sizes it is checked at.

A ``ZooModel`` names its symbols with ranges (``dims``), where each symbol sits in which input (``places``), and
builds its inputs from a size per symbol, so one entry says how to export it (``dynamic_shapes()``) and where to
compare it with eager (``cases()``: the example, every range's ends, and a size inside). Small configs keep a whole
zoo run within minutes on two cores; the architectures (attention variants, norms, position encodings, strided
convolutions) are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str             # decoder LM, encoder, encoder-decoder, vision transformer, CNN, segmentation, audio
    library: str            # transformers, timm or torchvision: where the architecture comes from
    make: Callable[[], nn.Module]
    inputs: Callable[[dict], tuple]            # {symbol: size} -> the inputs (CPU tensors)
    places: dict                               # input name -> {dim: symbol}
    dims: dict                                 # symbol -> (min, max)
    example: dict                              # symbol -> the example's size
    inside: dict = field(default_factory=dict)  # symbol -> a size inside the range that is not the example's

    def build(self) -> nn.Module:
        torch.manual_seed(0)
        return _jitter_one_dim(self.make().eval())

    def dynamic_shapes(self) -> dict:
        return {inp: {d: (sym, *self.dims[sym]) for d, sym in where.items()} for inp, where in self.places.items()}

    def cases(self) -> list[dict]:
        """The sizes compared with eager: the example, all symbols at their minimum, at their maximum, and inside."""
        lo = {s: r[0] for s, r in self.dims.items()}
        hi = {s: r[1] for s, r in self.dims.items()}
        mid = {s: self.inside.get(s, (r[0] + r[1]) // 2 + 1) for s, r in self.dims.items()}
        out = []
        for case in (self.example, lo, hi, mid):
            if case not in out:
                out.append(case)
        return out


def _jitter_one_dim(module: nn.Module) -> nn.Module:
    """Every 1-d parameter (norm scales and shifts, biases, layer scales) and every all-zero one gets seeded noise
    on top of its initial value: the libraries initialise biases to 0, layer scales to 1e-6 and torchvision's ViT
    head to 0, which would let a wrong bias, a dropped norm shift, a skipped block or a whole wrong network (the
    head's output would not depend on it) still match eager."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and (p.dim() <= 1 or not p.any()):
                p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _ids(sizes: dict, vocab: int, seq: str = "seq", seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 31 * sizes["batch"] + sizes[seq])
    return torch.randint(0, vocab, (sizes["batch"], sizes[seq]), generator=g)


def _image(sizes: dict, fixed: int | None = None) -> torch.Tensor:
    side = fixed or sizes["size"]
    g = torch.Generator().manual_seed(7 * sizes["batch"] + side)
    return torch.randn(sizes["batch"], 3, side, side, generator=g)


class _First(nn.Module):
    """A library model as tensors in, one tensor out (its ``logits`` or ``last_hidden_state``, whatever comes
    first), with the input named as the dynamic shapes name it."""

    def __init__(self, inner: nn.Module, **call):
        super().__init__()
        self.inner, self.call = inner, call

    def first(self, **kw):
        out = self.inner(**kw, **self.call)
        if isinstance(out, dict):
            return next(iter(out.values()))
        return out[0] if isinstance(out, (tuple, list)) else out


class Ids(_First):
    def forward(self, input_ids):
        return self.first(input_ids=input_ids)


class Pixels(_First):
    def forward(self, pixel_values):
        return self.first(pixel_values=pixel_values)


class Features(_First):
    def forward(self, input_features):
        return self.first(input_features=input_features)


class Audio(_First):
    def forward(self, input_values):
        return self.first(input_values=input_values)


class Seq2Seq(_First):
    def forward(self, input_ids, decoder_input_ids):
        return self.first(input_ids=input_ids, decoder_input_ids=decoder_input_ids)


class Plain(nn.Module):
    """A timm or torchvision module (positional input) under the input name the dynamic shapes use; a dict output
    (torchvision's segmentation models) gives its ``out``."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, pixel_values):
        out = self.inner(pixel_values)
        return out["out"] if isinstance(out, dict) else out


# --- transformers ----------------------------------------------------------------------------------------------

VOCAB = 256
LM_DIMS = {"batch": (1, 4), "seq": (1, 32)}
LM_EXAMPLE = {"batch": 2, "seq": 8}
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
             max_position_embeddings=64)


def _hf(config_name: str, model_name: str, wrap=Ids, call=None, **cfg):
    """A transformers model from its config class, built lazily (transformers imports only when the zoo runs)."""

    def make():
        import transformers

        config = getattr(transformers, config_name)(**cfg)
        return wrap(getattr(transformers, model_name)(config), **(call or {}))
    return make


def _lm(name: str, config: str, model: str, family: str = "decoder LM", call=None, **cfg) -> ZooModel:
    call = {"use_cache": False} if call is None and family == "decoder LM" else (call or {})
    return ZooModel(name, family, "transformers", _hf(config, model, call=call, **cfg),
                    lambda s: (_ids(s, VOCAB),), {"input_ids": {0: "batch", 1: "seq"}}, LM_DIMS, LM_EXAMPLE)


_GQA = dict(SMALL, num_key_value_heads=2, use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)

DECODERS = [
    _lm("gpt2", "GPT2Config", "GPT2LMHeadModel", n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64),
    _lm("llama", "LlamaConfig", "LlamaForCausalLM", **_GQA),
    _lm("mistral", "MistralConfig", "MistralForCausalLM", sliding_window=16, **_GQA),
    _lm("qwen2", "Qwen2Config", "Qwen2ForCausalLM", **_GQA),
    _lm("qwen3", "Qwen3Config", "Qwen3ForCausalLM", head_dim=16, **_GQA),
    _lm("gemma", "GemmaConfig", "GemmaForCausalLM", head_dim=16, **_GQA),
    _lm("gemma2", "Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=16, **_GQA),
    _lm("phi", "PhiConfig", "PhiForCausalLM", **dict(SMALL, use_cache=False)),
    _lm("phi3", "Phi3Config", "Phi3ForCausalLM", **dict(_GQA, original_max_position_embeddings=64)),
    _lm("opt", "OPTConfig", "OPTForCausalLM", hidden_size=64, ffn_dim=128, num_hidden_layers=2,
        num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=64, word_embed_proj_dim=64),
    _lm("falcon", "FalconConfig", "FalconForCausalLM", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, new_decoder_architecture=True, num_kv_heads=2, use_cache=False),
    _lm("gpt-neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", **dict(SMALL, use_cache=False)),
    _lm("gpt-j", "GPTJConfig", "GPTJForCausalLM", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=VOCAB,
        n_positions=64, use_cache=False),
    _lm("bloom", "BloomConfig", "BloomForCausalLM", hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB,
        use_cache=False),
    _lm("stablelm", "StableLmConfig", "StableLmForCausalLM", **_GQA),
]

_ENC = dict(SMALL, type_vocab_size=2)

ENCODERS = [
    _lm("bert", "BertConfig", "BertModel", family="encoder", **_ENC),
    _lm("roberta", "RobertaConfig", "RobertaModel", family="encoder", **dict(_ENC, max_position_embeddings=80)),
    _lm("distilbert", "DistilBertConfig", "DistilBertModel", family="encoder", dim=64, hidden_dim=128, n_layers=2,
        n_heads=4, vocab_size=VOCAB, max_position_embeddings=64),
    _lm("deberta-v2", "DebertaV2Config", "DebertaV2Model", family="encoder",
        **dict(_ENC, relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"])),
    _lm("albert", "AlbertConfig", "AlbertModel", family="encoder", embedding_size=32, **_ENC),
    _lm("electra", "ElectraConfig", "ElectraModel", family="encoder", embedding_size=32, **_ENC),
    _lm("xlm-roberta", "XLMRobertaConfig", "XLMRobertaModel", family="encoder",
        **dict(_ENC, max_position_embeddings=80)),
]


def _seq2seq(name: str, config: str, model: str, **cfg) -> ZooModel:
    return ZooModel(name, "encoder-decoder", "transformers", _hf(config, model, wrap=Seq2Seq,
                                                                call={"use_cache": False}, **cfg),
                    lambda s: (_ids(s, VOCAB), _ids(s, VOCAB, "dseq", seed=5)),
                    {"input_ids": {0: "batch", 1: "seq"}, "decoder_input_ids": {0: "batch", 1: "dseq"}},
                    {"batch": (1, 4), "seq": (1, 32), "dseq": (1, 16)}, {"batch": 2, "seq": 8, "dseq": 4})


ENCODER_DECODERS = [
    _seq2seq("t5", "T5Config", "T5ForConditionalGeneration", d_model=64, d_ff=128, d_kv=16, num_layers=2,
             num_heads=4, vocab_size=VOCAB, decoder_start_token_id=0, relative_attention_num_buckets=8),
    _seq2seq("bart", "BartConfig", "BartForConditionalGeneration", d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
             vocab_size=VOCAB, max_position_embeddings=64),
]

_IMG = 64
_BATCH = {"batch": (1, 4)}


def _vit_like(name: str, config: str, model: str, **cfg) -> ZooModel:
    return ZooModel(name, "vision transformer", "transformers", _hf(config, model, wrap=Pixels, **cfg),
                    lambda s: (_image(s, _IMG),), {"pixel_values": {0: "batch"}}, _BATCH, {"batch": 2})


_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=_IMG,
            patch_size=16)

VISION = [
    _vit_like("vit", "ViTConfig", "ViTModel", **_VIT),
    _vit_like("deit", "DeiTConfig", "DeiTModel", **_VIT),
    _vit_like("beit", "BeitConfig", "BeitModel", use_relative_position_bias=True, **_VIT),
    _vit_like("dinov2", "Dinov2Config", "Dinov2Model", **dict(_VIT, mlp_ratio=2)),
    _vit_like("swin", "SwinConfig", "SwinModel", image_size=_IMG, patch_size=4, embed_dim=16, depths=[1, 2],
              num_heads=[2, 4], window_size=4),
]


def _cnn(name: str, library: str, make, spatial: tuple | None = (64, 128), example_size: int = 96,
         family: str = "CNN") -> ZooModel:
    """A CNN with dynamic batch and, where ``spatial`` gives a range, a dynamic square image side ``size``. The
    range starts at 64: from 33 down a stride-32 network's last feature map is 1x1, a size torch.export
    specialises (it demands ``(size - 1) // 32 + 1 != 1``), for us and every peer alike."""
    if spatial is None:
        return ZooModel(name, family, library, make, lambda s: (_image(s, example_size),),
                        {"pixel_values": {0: "batch"}}, _BATCH, {"batch": 2})
    return ZooModel(name, family, library, make, lambda s: (_image(s),),
                    {"pixel_values": {0: "batch", 2: "size", 3: "size"}}, {**_BATCH, "size": spatial},
                    {"batch": 2, "size": example_size}, inside={"size": 97})


_HF_CNN = [
    _cnn("hf-resnet", "transformers", _hf("ResNetConfig", "ResNetModel", wrap=Pixels, embedding_size=16,
                                          hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic")),
    _cnn("hf-convnext", "transformers", _hf("ConvNextConfig", "ConvNextModel", wrap=Pixels,
                                            hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1])),
]

AUDIO = [
    ZooModel("whisper-encoder", "audio", "transformers",
             _hf("WhisperConfig", "WhisperModel", wrap=lambda m: Features(m.get_encoder()), d_model=64,
                 encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16,
                 max_source_positions=50, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128),
             lambda s: (torch.randn(s["batch"], 16, 100, generator=torch.Generator().manual_seed(s["batch"])),),
             {"input_features": {0: "batch"}}, _BATCH, {"batch": 2}),
    ZooModel("wav2vec2", "audio", "transformers",
             _hf("Wav2Vec2Config", "Wav2Vec2Model", wrap=Audio, hidden_size=64, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32), conv_kernel=(10, 3, 3),
                 conv_stride=(5, 2, 2), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                 feat_extract_norm="layer", do_stable_layer_norm=True),
             lambda s: (torch.randn(s["batch"], s["samples"],
                                    generator=torch.Generator().manual_seed(s["batch"] + s["samples"])),),
             {"input_values": {0: "batch", 1: "samples"}}, {"batch": (1, 4), "samples": (400, 4000)},
             {"batch": 2, "samples": 1600}, inside={"samples": 2467}),
]


# --- timm and torchvision (imported only when the zoo runs; tests/zoo/vision_libs.py) ---------------------------

def _timm(arch: str, **kw):
    def make():
        import timm

        return Plain(timm.create_model(arch, pretrained=False, num_classes=10, **kw))
    return make


def _tv(builder: str, **kw):
    def make():
        import torchvision

        return Plain(getattr(torchvision.models, builder)(weights=None, num_classes=10, **kw))
    return make


def _tv_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    return Plain(VisionTransformer(image_size=_IMG, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64,
                                   mlp_dim=128, num_classes=10))


def _tv_deeplab():
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    return Plain(deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=5, aux_loss=False))


def _tv_lraspp():
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    return Plain(lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=5))


def _tv_fcn():
    """torchvision's FCN head over a ResNet-18 trunk (its builders offer only ResNet-50/101, too big for CI)."""
    from torchvision.models import resnet18
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.fcn import FCN, FCNHead

    return Plain(FCN(IntermediateLayerGetter(resnet18(weights=None), {"layer4": "out"}), FCNHead(512, 5)))


TIMM = [
    _cnn("timm-resnet18", "timm", _timm("resnet18")),
    _cnn("timm-mobilenetv3", "timm", _timm("mobilenetv3_small_050")),
    _cnn("timm-efficientnet", "timm", _timm("efficientnet_b0")),
    _cnn("timm-convnext", "timm", _timm("convnext_atto")),
    _cnn("timm-regnet", "timm", _timm("regnetx_002")),
    _cnn("timm-vit", "timm", _timm("vit_tiny_patch16_224", img_size=_IMG), spatial=None, example_size=_IMG,
         family="vision transformer"),
    _cnn("timm-deit", "timm", _timm("deit_tiny_patch16_224", img_size=_IMG), spatial=None, example_size=_IMG,
         family="vision transformer"),
]

TORCHVISION = [
    _cnn("tv-resnet18", "torchvision", _tv("resnet18")),
    _cnn("tv-mobilenet-v3", "torchvision", _tv("mobilenet_v3_small")),
    _cnn("tv-efficientnet", "torchvision", _tv("efficientnet_b0")),
    _cnn("tv-squeezenet", "torchvision", _tv("squeezenet1_1")),
    _cnn("tv-shufflenet", "torchvision", _tv("shufflenet_v2_x0_5")),
    _cnn("tv-vit", "torchvision", _tv_vit, spatial=None, example_size=_IMG, family="vision transformer"),
    _cnn("tv-deeplabv3", "torchvision", _tv_deeplab, family="segmentation"),
    _cnn("tv-lraspp", "torchvision", _tv_lraspp, family="segmentation"),
    _cnn("tv-fcn", "torchvision", _tv_fcn, family="segmentation"),
]

ZOO = {m.name: m for m in DECODERS + ENCODERS + ENCODER_DECODERS + VISION + _HF_CNN + AUDIO + TIMM + TORCHVISION}

# one fast model per family, run in every CI run (transformers only: CI's venv has no timm or torchvision)
CI_SUBSET = ["gemma", "electra", "t5", "vit", "hf-resnet", "whisper-encoder"]
# the GPU backend in every CI run: this one's package also has sm_90 cubins, and runs in Triton's interpreter
CI_CUDA = "gemma"
