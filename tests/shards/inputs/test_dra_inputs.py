"""Reading DRA objects (shards/inputs/dra.py, draobjects.py): what is honoured, what is
refused naming the field, and how a node's devices become its cards and labels."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.errors import InputError
from events.types import NodeSpec, PodSpec
from shards.inputs.dra import DRIVER_LABEL, ClaimPending, DraCatalog
from shards.inputs.draobjects import parse_selectors, resource_slice

DRIVER = "gpu.example.com"


def cel(*expressions: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in expressions]


def slice_obj(node: str, devices: list[dict[str, Any]], generation: int = 1, **spec: Any) -> Any:
    return {
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{generation}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
            **spec,
        },
    }


def device(name: str, **attributes: Any) -> dict[str, Any]:
    return {"name": name, "attributes": attributes}


@pytest.mark.parametrize(
    ("expressions", "driver", "attributes"),
    [
        (['device.driver == "gpu.example.com"'], DRIVER, ()),
        (["device.driver == 'gpu.example.com'"], DRIVER, ()),
        (
            ['device.driver == "d" && device.attributes["d"].model == "H100"'],
            "d",
            (("d/model", "s:H100"),),
        ),
        (['device.attributes["d"]["cores"] == 80'], "", (("d/cores", "i:80"),)),
        (['(device.attributes["d"].mig == false)'], "", (("d/mig", "b:false"),)),
        (['device.attributes["d"].name == "a && b"'], "", (("d/name", "s:a && b"),)),
    ],
)
def test_the_simple_selectors_are_read(
    expressions: list[str], driver: str, attributes: tuple[tuple[str, str], ...]
) -> None:
    selection = parse_selectors(cel(*expressions), "selectors")
    assert (selection.driver, selection.attributes) == (driver, attributes)


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["d"].cores > 8',
        'device.capacity["d"].memory.compareTo(quantity("40Gi")) >= 0',
        'device.driver == "a" || device.driver == "b"',
        'device.attributes["d"].version == semver("1.0.0")',
        "true",
    ],
)
def test_any_other_selector_is_refused_naming_it(expression: str) -> None:
    with pytest.raises(InputError) as refused:
        parse_selectors(cel(expression), "spec.selectors")
    assert refused.value.location == "spec.selectors[0].cel.expression"
    assert "not one shoal evaluates" in refused.value.message


@settings(max_examples=30, deadline=None)
@given(
    domain=st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,2}", fullmatch=True),
    name=st.from_regex(r"[a-zA-Z][a-zA-Z0-9]{0,10}", fullmatch=True),
    value=st.one_of(
        st.integers(-(10**6), 10**6), st.booleans(), st.text("abcXYZ 09-._", max_size=12)
    ),
)
def test_an_attribute_equality_compares_like_the_slices_attribute(
    domain: str, name: str, value: int | bool | str
) -> None:
    """What a selector asks equals what a slice's attribute of that value says."""
    literal = (
        ("true" if value else "false")
        if isinstance(value, bool)
        else str(value)
        if isinstance(value, int)
        else f'"{value}"'
    )
    selection = parse_selectors(cel(f'device.attributes["{domain}"].{name} == {literal}'), "s")
    kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "string"
    published = resource_slice(
        slice_obj("n", [{"name": "g", "attributes": {f"{domain}/{name}": {kind: value}}}])
    )
    assert selection.attributes == published.devices[0][1]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"nodeName": None, "allNodes": True}, "spec.allNodes"),
        ({"nodeName": None, "nodeSelector": {"nodeSelectorTerms": []}}, "spec.nodeSelector"),
        ({"sharedCounters": [{"name": "c"}]}, "spec.sharedCounters"),
    ],
)
def test_slices_out_of_scope_are_refused(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as refused:
        resource_slice(slice_obj("n", [device("g")], **spec))
    assert refused.value.location == field


@pytest.mark.parametrize("key", ["taints", "consumesCounters", "allowMultipleAllocations"])
def test_devices_out_of_scope_are_refused(key: str) -> None:
    value: Any = True if key == "allowMultipleAllocations" else [{"x": 1}]
    with pytest.raises(InputError) as refused:
        resource_slice(slice_obj("n", [{"name": "g", key: value}]))
    assert refused.value.location == f"spec.devices[0].{key}"


def _node(name: str = "n") -> NodeSpec:
    return NodeSpec(name=name, allocatable={"cpu": 8000, "pods": 110})


def test_the_newest_generation_of_a_pool_counts_and_shared_attributes_become_labels() -> None:
    catalog = DraCatalog()
    model = {"string": "H100"}
    catalog.add(slice_obj("n", [device("old-0"), device("old-1"), device("old-2")], generation=1))
    catalog.add(
        slice_obj(
            "n",
            [
                device("gpu-1", model=model, index={"int": 1}),
                device("gpu-0", model=model, index={"int": 0}),
            ],
            generation=2,
        )
    )
    spec = catalog.node(_node())
    assert [d.device for d in spec.devices] == ["gpu-0", "gpu-1"]
    assert spec.allocatable["nvidia.com/gpu"] == 2
    assert spec.labels[DRIVER_LABEL] == DRIVER
    assert spec.labels[f"dra.shoal.io/{DRIVER}/model"] == "s:H100"
    assert f"dra.shoal.io/{DRIVER}/index" not in spec.labels  # differs between devices
    # its slices gone, a node has no cards left
    catalog.slices.clear()
    bare = catalog.node(spec)
    assert bare.devices == () and "nvidia.com/gpu" not in bare.allocatable
    assert DRIVER_LABEL not in bare.labels


def _claim(requests: list[dict[str, Any]], **devices: Any) -> dict[str, Any]:
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": "u1"},
        "spec": {"devices": {"requests": requests, **devices}},
    }


def _pod_with_claim(catalog: DraCatalog) -> tuple[PodSpec, list[str]]:
    pod = PodSpec(namespace="default", name="p", uid="pod-uid", requests={"cpu": 1000})
    return catalog.pod(pod, {"resourceClaims": [{"name": "g", "resourceClaimName": "c"}]})


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (  # selectors beside exactly, not in it: refused, not dropped
            {"name": "r", "exactly": {"deviceClassName": "gpu"}, "selectors": []},
            "spec.devices.requests[0].selectors",
        ),
        (
            {"name": "r", "exactly": {"deviceClassName": "gpu", "allocationMode": "Some"}},
            "spec.devices.requests[0].exactly.allocationMode",
        ),
        (
            {
                "name": "r",
                "exactly": {"deviceClassName": "gpu", "allocationMode": "All", "count": 2},
            },
            "spec.devices.requests[0].exactly.count",
        ),
        (
            {"name": "r", "exactly": {"deviceClassName": "gpu", "adminAccess": True}},
            "spec.devices.requests[0].exactly.adminAccess",
        ),
        (
            {"name": "r", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]},
            "spec.devices.requests[0].firstAvailable",
        ),
        (
            {"name": "r", "exactly": {"deviceClassName": "gpu", "count": 0}},
            "spec.devices.requests[0].exactly.count",
        ),
    ],
)
def test_requests_out_of_scope_are_refused(request_: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as refused:
        DraCatalog().add(_claim([request_]))
    assert refused.value.location == field


def test_a_pod_asks_for_its_claims_as_whole_cards_on_nodes_that_match() -> None:
    catalog = DraCatalog()
    catalog.add(
        {
            "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {"selectors": cel(f'device.driver == "{DRIVER}"')},
        }
    )
    with pytest.raises(ClaimPending):
        _pod_with_claim(catalog)
    selector = f'device.attributes["{DRIVER}"].model == "H100"'
    catalog.add(
        _claim(
            [
                {"name": "a", "exactly": {"deviceClassName": "gpu", "count": 2}},
                {"name": "b", "exactly": {"deviceClassName": "gpu", "selectors": cel(selector)}},
            ]
        )
    )
    pod, names = _pod_with_claim(catalog)
    assert names == ["c"]
    assert pod.requests == {"cpu": 1000, "nvidia.com/gpu": 3}
    assert pod.node_selector == {DRIVER_LABEL: DRIVER, f"dra.shoal.io/{DRIVER}/model": "s:H100"}
    assert [(c.claim, c.request, c.count, c.uid) for c in pod.claims] == [
        ("c", "a", 2, "u1"),
        ("c", "b", 1, "u1"),
    ]
