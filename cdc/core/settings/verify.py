"""How `cdc verify` compares the stores with the source (`[verify]`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class VerifySettings(BaseModel):
    """Where verify's comparison runs: on Spark's executors, or in the `cdc` process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Literal["auto", "spark", "python"] = Field(
        "auto",
        description="where each table's rows are compared: spark (on Spark's executors: the "
        "source read in slices at one exported snapshot, each store read in parallel, each "
        "key's content hash joined in Spark; only the keys that differ reach the `cdc` "
        "process), python (every row read into the `cdc` process), or auto (python for a "
        "table whose heap is at most python_max_bytes, where starting Spark's jobs costs "
        "more than the rows; spark for a larger one). A store that cannot be read on the "
        "executors is compared in Python",
    )
    partitions: int = Field(
        0,
        ge=0,
        description="the slices of a table read in parallel from the source and from each "
        "store (Spark tasks per side); 0: Spark's default parallelism (its cores)",
    )
    python_max_bytes: int = Field(
        32 * 2**20,
        ge=0,
        description="engine auto: a table whose heap (pg_relation_size, every partition) is "
        "at most this is compared in Python",
    )
