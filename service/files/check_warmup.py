"""Imported by the upload checks' forkserver (service/files/check_runner.py) only: checks one tiny file of
each format, so that the readers' lazily loaded parts are loaded before the children are forked,
not again in each child."""

from __future__ import annotations

import tempfile
from pathlib import Path

from service.files.upload_checks import check_upload
from shared.data.limits import FileLimits

_SAMPLES = {
    "warm.csv": b"sentence,label\nfine,1\n",
    "warm.tsv": b"sentence\tlabel\nfine\t1\n",
    "warm.jsonl": b'{"sentence": "fine", "label": 1}\n',
    "warm.json": b'[{"sentence": "fine", "label": 1}]',
}


def _warm() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="gluejobs-warm-") as folder:
        for name, content in _SAMPLES.items():
            (Path(folder) / name).write_bytes(content)
        pq.write_table(pa.table({"sentence": ["fine"], "label": [1]}), Path(folder) / "warm.parquet")
        for name in [*_SAMPLES, "warm.parquet"]:
            check_upload(
                Path(folder) / name, filename=name, purpose="train", task=None, limits=FileLimits.defaults()
            )


_warm()
