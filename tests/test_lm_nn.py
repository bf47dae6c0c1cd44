"""Language-model building blocks: causal masking, KV-cache decoding, padding masks, parameter/FLOP counts."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import UserError
from attnlab.nn.attention import KVCache, MultiHeadAttention
from attnlab.nn.bert import BertConfig, BertMLM
from attnlab.nn.gpt import GPT, GPTConfig
from attnlab.nn.layers import Block


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32) | kw
    return GPT(GPTConfig(**cfg)).eval()


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_changing_a_later_token_leaves_earlier_logits_unchanged(positional, norm_position):
    model = _gpt(positional=positional, norm_position=norm_position, norm="rmsnorm", ffn="swiglu")
    idx = torch.randint(0, 50, (2, 12))
    t = 6
    changed = idx.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % 50
    a, b = model(idx), model(changed)                              # (B, T, V)
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)
    assert not torch.allclose(a[:, t + 1], b[:, t + 1], atol=1e-5)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "alibi"])
def test_kv_cache_generation_equals_full_recomputation(positional):
    model = _gpt(positional=positional)
    idx = torch.randint(0, 50, (3, 5))
    out = model.generate(idx, max_new_tokens=25, temperature=0)    # crosses block_size=16: crop + recompute
    ref = idx
    for _ in range(25):
        logits = model(ref[:, -16:])[:, -1]
        ref = torch.cat([ref, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ref)

    # the cached logits themselves match, position by position
    caches = [KVCache() for _ in model.blocks]
    steps = [model(idx[:, :3], caches)[:, -1]] + [model(idx[:, i : i + 1], caches)[:, -1] for i in (3, 4)]
    full = model(idx)
    for step, pos in zip(steps, (2, 3, 4)):
        assert torch.allclose(step, full[:, pos], atol=1e-5)


def test_sampling_with_top_k_stays_in_the_top_k():
    model = _gpt()
    idx = torch.zeros(1, 1, dtype=torch.long)
    logits = model(idx)[:, -1, :50]
    allowed = set(logits.topk(3).indices[0].tolist())
    g = torch.Generator().manual_seed(0)
    firsts = {int(model.generate(idx, 1, temperature=1.0, top_k=3, generator=g)[0, 1]) for _ in range(30)}
    assert firsts <= allowed and len(firsts) > 1


def test_padding_mask_hides_padded_keys():
    torch.manual_seed(0)
    block = Block(32, 4, 64, norm_position="post").eval()
    x = torch.randn(1, 6, 32)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]]).bool()
    y = block(x, key_padding_mask=mask)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 32)                               # change only the padding
    assert torch.allclose(y[:, :4], block(x2, key_padding_mask=mask)[:, :4], atol=1e-5)
    bert = BertMLM(BertConfig(vocab_size=40, max_length=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0)).eval()
    ids = torch.tensor([[3, 4, 5, 0, 0], [3, 4, 5, 7, 9]])
    logits = bert(ids, torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    alone = bert(ids[:1, :3], torch.ones(1, 3))
    assert torch.allclose(logits[0, :3], alone[0], atol=1e-5)
    at = torch.tensor([[False, True, False, False, False], [True, False, False, True, False]])
    assert torch.allclose(bert(ids, torch.ones(2, 5), at), bert(ids, torch.ones(2, 5))[at], atol=1e-5)


def test_cross_attention_reads_the_context():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, cross=True).eval()
    x, ctx = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    assert attn(x, ctx).shape == (2, 3, 16)
    assert not torch.allclose(attn(x, ctx), attn(x, torch.randn(2, 7, 16)))


def test_parameter_count_weight_tying_and_flops_match_nanogpt():
    model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128))
    assert model.lm_head.weight is model.embed.wte.weight
    assert round(model.num_params() / 1e6, 2) == 0.80               # nanoGPT prints 0.80M for this model
    n = model.num_params()
    assert model.flops_per_token() == 6 * n + 12 * 4 * 4 * 32 * 64
    assert "embed.pos.wpe.weight" in model.no_weight_decay()
    proj = model.blocks[0].attn.out_proj.weight.std().item()         # GPT-2 init: residual projections scaled
    assert 0.02 / (2 * 4) ** 0.5 * 0.8 < proj < 0.02 / (2 * 4) ** 0.5 * 1.2
    untied = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, tie_weights=False))
    assert untied.flops_per_token() == model.flops_per_token()     # the extra table is a lookup: no FLOPs


def test_alibi_biases_scores_by_distance():
    from attnlab.nn.positional import ALiBi

    assert ALiBi.head_slopes(8) == [2 ** -(i + 1) for i in range(8)]  # the paper's 1/2 ... 1/256
    assert len(ALiBi.head_slopes(6)) == 6 and ALiBi.head_slopes(6)[:4] == ALiBi.head_slopes(4)
    bias = ALiBi(4).bias(2, 5, offset=3)                             # queries at 3 and 4, keys 0..4
    assert bias.shape == (4, 2, 5) and bias[0, 0].tolist() == [-0.75, -0.5, -0.25, 0.0, -0.25]  # slope 1/4
    model = _gpt(positional="alibi")
    assert not any("pos" in n for n, _ in model.named_parameters())  # no position embedding at all
    idx = torch.randint(0, 50, (1, 10))
    shifted = model(idx[:, 1:])[:, -1]                              # ALiBi sees only distances: the last logits
    assert not torch.allclose(model(idx)[:, -1], shifted, atol=1e-6)  # depend on how far back the context goes


@pytest.mark.parametrize(("override", "message"), [
    ({"positional": "alibii"}, "positional=alibii is not one of sinusoidal, learned, rope, alibi"),
    ({"norm": "batchnorm"}, "norm=batchnorm is not one of layernorm, rmsnorm"),
    ({"ffn": "tanh"}, "ffn=tanh is not one of relu, gelu, gelu_tanh, swiglu"),
    ({"n_head": 3}, r"n_embd=32 does not split into n_head=3 heads"),
])
def test_bad_model_settings_are_user_errors(override, message):
    with pytest.raises(UserError, match=message):
        GPTConfig(**{"vocab_size": 50, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32} | override)


def test_sequence_longer_than_the_positional_table_is_a_user_error():
    model = _gpt(block_size=8)
    with pytest.raises(UserError, match=r"longer than the model's positional table \(model.block_size=8\)"):
        model(torch.zeros(1, 9, dtype=torch.long))
