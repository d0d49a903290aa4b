"""GET /backends: what each backend is, whether it can answer here and why not, where it runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fastinfer.catalog import choice
from fastinfer.catalog.backends import BackendSpec
from fastinfer.catalog.config import Settings
from fastinfer.catalog.family import FamilyInfo
from fastinfer.catalog.family import summary as family_summary
from fastinfer.catalog.store import StoredModelInfo
from fastinfer.common.schemas import BackendInfo, BackendsResponse, BatchingInfo


class Entry(Protocol):
    spec: BackendSpec
    runner: str


def backends(
    registry: Mapping[str, Entry],
    unavailable: Mapping[str, str],
    models: Mapping[str, StoredModelInfo],
    described: Mapping[str, dict[str, Any]],
    settings: Settings,
    machine: dict[str, Any],
    default: choice.DefaultChoice | None = None,
    family: FamilyInfo | None = None,
) -> BackendsResponse:
    """The /backends answer: the table, what cannot run here, the stored models, what each runner says of itself
    (``described``: runner → its ``describe()`` or ``{"error": why}``), and their family (default: the models')."""
    family = family or family_summary(settings.model, models)
    infos = []
    for name, entry in registry.items():
        model = models.get(name)
        reason = unavailable.get(name)
        runs_on = dict(described.get(entry.runner, {})) if reason is None else {}
        if reason is None and "error" in runs_on:
            reason = runs_on.pop("error")
        infos.append(
            BackendInfo(
                name=name,
                description=entry.spec.description,
                available=reason is None,
                reason=reason,
                model=model.tag if model else None,
                models=runs_on.pop("models", [model.tag] if model else []),
                weights=model.weights if model else None,
                accuracy=family.accuracy.get(name),
                runs_on=runs_on,
                batching=BatchingInfo.model_validate(settings.batching_for(name), from_attributes=True),
            )
        )
    available = [i.name for i in infos if i.available]
    default = default or choice.default_choice()
    return BackendsResponse(
        family=family,
        default=default.backend,
        default_choice=default.as_dict(),
        configuration=choice.configuration(settings, default),
        tuned=settings.tuned,
        hardware=machine,
        recommended=choice.recommend(machine, available, *choice.measurements(machine)),  # unit unused if None
        backends=infos,
    )
