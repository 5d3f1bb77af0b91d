"""Datasets: register a JSONL or Parquet file of verl / Skywork-OR1 records, list, show, delete.

    POST   /v1/datasets          register (validates every record; returns the summary)
    GET    /v1/datasets          list registered datasets
    GET    /v1/datasets/{name}   one dataset's summary
    DELETE /v1/datasets/{name}   forget it (the file is left alone)
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from magic.config.schema import DatasetSpec
from magic.controller.api.deps import Authorized, ControllerDep, not_found
from magic.controller.datasets import DatasetError, DatasetInfo

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetInfo,
    dependencies=Authorized,
    responses={400: {"description": "the file is missing or a record is malformed"}, 409: {"description": "the name is taken by another file"}},
)
def register_dataset(spec: DatasetSpec, c: ControllerDep, response: Response, replace: Annotated[bool, Query()] = False) -> DatasetInfo:
    """Validate every record of the file and register it under `name`. Registering the same
    unchanged file under the same name again returns 200; another file under a taken name is a
    409 unless `?replace=true`."""
    try:
        info, created = c.datasets.register(spec, replace=replace)
    except DatasetError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"dataset {spec.name!r}: {exc}") from None
    except FileExistsError:
        raise HTTPException(status.HTTP_409_CONFLICT, f"a different file is registered as {spec.name!r}; use ?replace=true or another name") from None
    if not created:
        response.status_code = status.HTTP_200_OK
    return info


@router.get("", response_model=list[DatasetInfo])
def list_datasets(c: ControllerDep) -> list[DatasetInfo]:
    return c.datasets.list()


@router.get("/{name}", response_model=DatasetInfo)
def get_dataset(name: str, c: ControllerDep) -> DatasetInfo:
    info = c.datasets.get(name)
    if info is None:
        raise not_found("dataset", name)
    return info


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, dependencies=Authorized)
def delete_dataset(name: str, c: ControllerDep) -> Response:
    if not c.datasets.delete(name):
        raise not_found("dataset", name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
