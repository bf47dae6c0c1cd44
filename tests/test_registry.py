"""One way to name a network: `model.net`, looked up in attnlab's registry (or an import path)."""

import pytest
import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.nn.registry import create_network, list_networks, network_spec, register_network


def test_every_task_names_its_network_in_the_registry():
    assert {"gpt", "bert", "transformer_seq2seq", "rnn_seq2seq", "unet", "encoder_decoder", "timm",
            "mae_vit"} <= set(list_networks())
    net, rest = create_network("gpt", {"vocab_size": 11, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 8,
                                       "num_samples": 3})
    assert net.config.n_layer == 1 and rest == {"num_samples": 3}  # the task's own settings come back


def test_class_paths_written_in_older_checkpoints_resolve_to_the_registered_network():
    assert network_spec("attnlab.nn.rnn_seq2seq.RNNSeq2Seq") is network_spec("rnn_seq2seq")


def test_an_unknown_name_lists_the_networks_and_says_how_to_use_ones_own():
    with pytest.raises(UserError, match=r"model.net=gtp is not one of attnlab's networks: use one of bert, .*gpt.*"
                                        r"import path of your own nn.Module"):
        create_network("gtp", {})


def test_a_new_network_registers_itself_and_a_task_builds_it_by_name():
    from attnlab.tasks.language_model import CausalLM

    @register_network("bigram_test")
    def bigram(vocab_size: int, block_size: int = 8) -> nn.Module:
        return nn.Embedding(vocab_size, vocab_size)

    task = CausalLM(vocab_size=5, block_size=4, net="bigram_test")
    assert isinstance(task.net, nn.Embedding)
    assert task(torch.zeros(2, 4, dtype=torch.long)).shape == (2, 4, 5)


def test_a_setting_given_as_zero_reaches_the_timm_network(monkeypatch):
    """model.drop_path_rate=0.0 is passed to timm like any other value; only null (None) leaves timm's default."""
    import timm

    from attnlab.nn import factory

    given = []
    create = timm.create_model
    monkeypatch.setattr(factory.timm, "create_model", lambda *a, **k: given.append(k) or create(*a, **k))
    for rate in (0.0, 0.2, None):
        create_network("timm", {"backbone": "vit_compact", "img_size": 8, "in_chans": 1, "drop_path_rate": rate})
    assert [k.get("drop_path_rate", "not given") for k in given] == [0.0, 0.2, "not given"]
