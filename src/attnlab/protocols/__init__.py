"""What the platform may call on the objects a run is made of, declared in one place.

- `network.py`: a network (the `nn.Module` a task builds): `block_classes()`, and timm's conventions.
- `task.py`: a task (the LightningModule `model._target_` names, attnlab's or a user's): its class-level hooks
  (`net_settings`, `init_tokenizer`, `init_settings`, `predictor`) and instance hooks (`check_data`,
  `batch_size_of`, `tokens_of`, `flops_per_sample`, `flops_of`, `decode_cfg`, `net`, `tokenizer_json`).
- `data.py`: a data module (the LightningDataModule `data._target_` names): `info()` and the `DataInfo` it returns,
  `use_tokenizer(json)`, `test_is_validation`, `benchmark_split`, `batch_size`, `train_set`.

Every hook is optional. The platform calls a hook only through the accessor declared next to its protocol
(`attnlab.protocols.task.check_data(task, info)`, ...), which gives the answer for an object without it; no other
module looks a hook up by name.
"""

from attnlab.protocols.network import BlockNetwork

__all__ = ["BlockNetwork"]
