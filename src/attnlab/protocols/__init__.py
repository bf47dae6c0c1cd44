"""What the platform may call on the objects a run is made of, declared in one place: a network (`network.py`), a task
(`task.py`) and a data module (`data.py`, with `DataInfo`). Every hook is optional: the accessor declared next to its
protocol (`attnlab.protocols.task.check_data(task, info)`, ...) gives the answer for an object without it.
"""

from attnlab.protocols.network import BlockNetwork

__all__ = ["BlockNetwork"]
