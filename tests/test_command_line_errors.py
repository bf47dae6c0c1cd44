"""What Hydra would answer with its own message (every option of a group and the search path, "Key ... is not in
struct", a YAML parser's traceback) is answered before Hydra runs, in one paragraph naming the group or key, the
closest valid names and where options come from. The same check of a command line that composes lets it through."""

from __future__ import annotations

import pytest

from attnlab.cli.hydra_errors import check_composes
from attnlab.config import CONF_DIR
from attnlab.errors import UserError
from conftest import run_cli


@pytest.mark.parametrize("argv, expected", [
    (["model=swni"], r"^model=swni: the config group 'model' has no option 'swni'\. Did you mean swin\?.* Options "
                     r"come from attnlab's configs \(.*/conf/model/\*\.yaml\); your own go in a folder given with "
                     r"--config-dir"),
    (["experiment=gpt_shakespeare"], r"^experiment=gpt_shakespeare: .*Did you mean gpt_shakespeare_char"),
    (["-m", "hparams_search=vit_digit_optuna"], r"has no option 'vit_digit_optuna'\. Did you mean vit_digits_optuna"),
    (["-m", "model=vit,swni", "data=digits"], r"^model=swni: "),  # every option of a swept group
    (["trainer.max_epoch=3"], r"^trainer\.max_epoch=3: trainer=default \(conf/trainer/default\.yaml\) has no key "
                              r"'max_epoch'\. Did you mean trainer\.max_epochs.*write \+trainer\.max_epoch=3\."),
    (["data=text", "data.image_size=32"], r"^data\.image_size=32: data=text \(conf/data/text\.yaml\) has no key "
                                          r"'image_size'\. Did you mean data\.vocab_size"),
    (["data=text", "data.zzz=1"], r"^data\.zzz=1: data=text .* has no key 'zzz'\. Its keys: .*block_size"),
    (["--cfg", "job", "optimizer=adamww"], r"^optimizer=adamww: .*Did you mean adamw"),
])
def test_a_command_line_hydra_cannot_compose_is_one_paragraph(argv, expected):
    with pytest.raises(UserError, match=expected):
        check_composes(argv, CONF_DIR, "train")


def test_a_malformed_yaml_in_a_config_dir_names_the_file_line_and_column(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("_target_: my.Task\nlayers: [1, 2\nwidth: 3\n")
    with pytest.raises(UserError, match=rf"^{tmp_path}/model/mine\.yaml, line 3, column 6 is not valid YAML: "
                                        r"expected ',' or '\]'"):
        check_composes(["--config-dir", str(tmp_path), "model=mine"], CONF_DIR, "train")


@pytest.mark.parametrize("argv", [
    ["model=vit", "data=cifar10", "trainer.max_epochs=2", "+model.drop_path_rate=0.1"],
    ["-m", "model=vit,swin", "optimizer.lr=1e-3,3e-4", "data=digits"],
    ["-m", "hparams_search=vit_digits_optuna"],
    ["experiment=gpt_shakespeare_char", "logger=null"],
    ["--help"], ["--cfg", "job"], ["-m", "seed=range(1,4)"],
])
def test_a_command_line_that_composes_passes(argv):
    check_composes([a.replace("logger=null", "~logger") for a in argv], CONF_DIR, "train")


def test_train_py_answers_a_mistyped_option_before_hydra(tmp_path, log_env):
    out = run_cli("train.py", "model=swni", env=log_env)
    assert out.returncode == 2, out.stdout[-2000:]
    assert "attnlab: error: model=swni: the config group 'model' has no option 'swni'. Did you mean swin?" in out.stdout
    assert "HYDRA_FULL_ERROR" not in out.stdout and "Config search path" not in out.stdout
