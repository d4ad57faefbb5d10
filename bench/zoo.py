"""The model-suite benchmark's models: families people deploy, random (seeded) weights, realistic sizes.

Every model is built from a config (transformers' where it has the architecture, else written here in plain torch,
following the reference implementation), so nothing is downloaded and the same model runs on every machine and
torch version. Each returns one tensor (logits or the last hidden state), the form every backend takes.

``CPU`` and ``GPU`` list the suites' entries: (model name, batches). The GPU list adds a ~1B Llama-style decoder.
"""

from __future__ import annotations

import torch
from torch import nn

from .models import BenchModel


class _First(nn.Module):
    """A transformers model as tensor-in, tensor-out: its first output (``logits`` or ``last_hidden_state``).
    The forward names its input as the suite's dynamic shapes do (subclasses below)."""

    def __init__(self, inner, **call):
        super().__init__()
        self.inner = inner
        self.call = call

    def run(self, x):
        return self.inner(x, return_dict=False, **self.call)[0]


class _Ids(_First):
    def forward(self, input_ids):
        return self.run(input_ids)


class _Pixels(_First):
    def forward(self, pixel_values):
        return self.run(pixel_values)


class _Features(_First):
    def forward(self, input_features):
        return self.run(input_features)


class _T5(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, decoder_input_ids):
        return self.inner(input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False,
                          return_dict=False)[0]


def _ids(batch: int, seq: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed + batch))


def _image(batch: int, size: int = 224) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))


def _seeded(make, fan_in_init: bool = False):
    def build():
        torch.manual_seed(0)
        m = make().eval()
        return _fan_in_init(m) if fan_in_init else m
    return build


def _fan_in_init(module: nn.Module) -> nn.Module:
    """He-normal weights (std sqrt(2 / fan_in)), unit batch norms: transformers' CNN configs initialise with std
    0.02, which shrinks activations through 16+ blocks until the logits are 0 and the layers compute on
    denormals (slow on CPUs, and an accuracy check that always passes). Real trained weights keep activations near
    unit scale; so does this."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (nn.Conv2d, nn.Linear)):
                fan_in = sub.weight[0].numel()
                sub.weight.normal_(0, (2.0 / fan_in) ** 0.5)
                if sub.bias is not None:
                    sub.bias.zero_()
            elif isinstance(sub, nn.BatchNorm2d):
                sub.weight.fill_(1.0)
                sub.bias.zero_()
    return module


def _lm(name: str, family: str, make, seq: int, vocab: int, max_batch: int = 64) -> BenchModel:
    return BenchModel(name, _seeded(make), lambda b: (_ids(b, seq, vocab),),
                      {"input_ids": {0: ("batch", 1, max_batch)}}, family=family)


def _vision(name: str, family: str, make, size: int = 224) -> BenchModel:
    return BenchModel(name, _seeded(make, fan_in_init=family == "CNN"), lambda b: (_image(b, size),),
                      {"pixel_values": {0: ("batch", 1, 64)}}, family=family)


# --- decoder LMs -----------------------------------------------------------------------------------------------

def gpt2(layers: int = 12, width: int = 768, heads: int = 12) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50257, n_positions=1024,
                     attn_implementation="sdpa")
    return _Ids(GPT2LMHeadModel(cfg), use_cache=False)


def llama(layers: int, width: int, heads: int, kv_heads: int, ffn: int, vocab: int = 32000) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=width, intermediate_size=ffn, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=2048, use_cache=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    return _Ids(LlamaForCausalLM(cfg), use_cache=False)


# --- encoders, encoder-decoder, audio --------------------------------------------------------------------------

def bert_base() -> nn.Module:
    from transformers import BertConfig, BertModel

    return _Ids(BertModel(BertConfig(attn_implementation="sdpa"), add_pooling_layer=False))


def t5_small() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64, vocab_size=32128,
                   decoder_start_token_id=0, use_cache=False)
    return _T5(T5ForConditionalGeneration(cfg))


def whisper_encoder(width: int = 384, layers: int = 4, heads: int = 6) -> nn.Module:
    from transformers import WhisperConfig, WhisperModel

    cfg = WhisperConfig(d_model=width, encoder_layers=layers, encoder_attention_heads=heads,
                        encoder_ffn_dim=4 * width, decoder_layers=1, num_mel_bins=80, attn_implementation="sdpa")
    return _Features(WhisperModel(cfg).get_encoder())


# --- vision transformers ---------------------------------------------------------------------------------------

def vit(width: int = 768, layers: int = 12, heads: int = 12) -> nn.Module:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * width,
                    image_size=224, patch_size=16, attn_implementation="sdpa")
    return _Pixels(ViTModel(cfg, add_pooling_layer=False))


def swin_tiny() -> nn.Module:
    from transformers import SwinConfig, SwinModel

    return _Pixels(SwinModel(SwinConfig(image_size=224, embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                                       window_size=7)))


# --- CNNs ------------------------------------------------------------------------------------------------------

def resnet(depths: list[int], bottleneck: bool) -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(depths=depths, layer_type="bottleneck" if bottleneck else "basic",
                       hidden_sizes=[256, 512, 1024, 2048] if bottleneck else [64, 128, 256, 512], num_labels=1000)
    return _Pixels(ResNetForImageClassification(cfg))


def convnext_tiny() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    return _Pixels(ConvNextForImageClassification(ConvNextConfig(depths=[3, 3, 9, 3],
                                                                hidden_sizes=[96, 192, 384, 768],
                                                                num_labels=1000)))


def efficientnet_b0() -> nn.Module:
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    cfg = EfficientNetConfig(image_size=224, width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280,
                             dropout_rate=0.2, num_labels=1000)  # the config's defaults are B7's
    return _Pixels(EfficientNetForImageClassification(cfg))


def mobilenet_v2() -> nn.Module:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    return _Pixels(MobileNetV2ForImageClassification(MobileNetV2Config(image_size=224, num_labels=1000)))


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

    def forward(self, x):
        s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        return x * torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


def _divisible(v: float, d: int = 8) -> int:
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


class _InvertedResidual(nn.Module):
    def __init__(self, cin, k, exp, cout, se, act, stride):
        super().__init__()
        Act = nn.Hardswish if act == "HS" else nn.ReLU
        layers = []
        if exp != cin:
            layers += [nn.Conv2d(cin, exp, 1, bias=False), nn.BatchNorm2d(exp), Act()]
        layers += [nn.Conv2d(exp, exp, k, stride, k // 2, groups=exp, bias=False), nn.BatchNorm2d(exp), Act()]
        if se:
            layers.append(_SqueezeExcite(exp, _divisible(exp // 4)))
        layers += [nn.Conv2d(exp, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3Small(nn.Module):
    """torchvision's mobilenet_v3_small (its block table), written out so the suite needs no torchvision."""

    SETTINGS = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2), (24, 3, 88, 24, False, "RE", 1),
                (24, 5, 96, 40, True, "HS", 2), (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
                (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1), (48, 5, 288, 96, True, "HS", 2),
                (96, 5, 576, 96, True, "HS", 1), (96, 5, 576, 96, True, "HS", 1)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish()]
        layers += [_InvertedResidual(*s) for s in self.SETTINGS]
        layers += [nn.Conv2d(96, 576, 1, bias=False), nn.BatchNorm2d(576), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, pixel_values):
        x = self.features(pixel_values)
        return self.classifier(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


# --- the suites' entries ---------------------------------------------------------------------------------------

def _whisper_input(batch: int) -> tuple:
    return (torch.randn(batch, 80, 3000, generator=torch.Generator().manual_seed(batch)),)


def _t5_inputs(batch: int) -> tuple:
    return _ids(batch, 64, 32128), _ids(batch, 16, 32128, seed=7)


MODELS = {
    "gpt2": lambda: _lm("gpt2", "decoder LM", gpt2, 64, 50257),
    "llama-small": lambda: _lm("llama-small", "decoder LM", lambda: llama(8, 512, 8, 2, 1408), 64, 32000),
    "llama-1b": lambda: _lm("llama-1b", "decoder LM", lambda: llama(16, 2048, 32, 8, 5632), 256, 32000, 16),
    "bert-base": lambda: _lm("bert-base", "encoder", bert_base, 128, 30522),
    "t5-small": lambda: BenchModel("t5-small", _seeded(t5_small), _t5_inputs,
                                   {"input_ids": {0: ("batch", 1, 64)}, "decoder_input_ids": {0: ("batch", 1, 64)}},
                                   family="encoder-decoder"),
    "whisper-tiny-encoder": lambda: BenchModel("whisper-tiny-encoder", _seeded(whisper_encoder), _whisper_input,
                                               {"input_features": {0: ("batch", 1, 64)}}, family="audio"),
    "vit-b16": lambda: _vision("vit-b16", "vision transformer", vit),
    "deit-tiny": lambda: _vision("deit-tiny", "vision transformer", lambda: vit(192, 12, 3)),
    "swin-tiny": lambda: _vision("swin-tiny", "vision transformer", swin_tiny),
    "resnet18": lambda: _vision("resnet18", "CNN", lambda: resnet([2, 2, 2, 2], False)),
    "resnet50": lambda: _vision("resnet50", "CNN", lambda: resnet([3, 4, 6, 3], True)),
    "mobilenetv3-small": lambda: _vision("mobilenetv3-small", "CNN", MobileNetV3Small),
    "mobilenetv2": lambda: _vision("mobilenetv2", "CNN", mobilenet_v2),
    "efficientnet-b0": lambda: _vision("efficientnet-b0", "CNN", efficientnet_b0),
    "convnext-tiny": lambda: _vision("convnext-tiny", "CNN", convnext_tiny),
}

CPU = [(name, [1, 8]) for name in MODELS if name != "llama-1b"]
GPU = [(name, [1, 4] if name == "llama-1b" else [1, 32]) for name in MODELS]
