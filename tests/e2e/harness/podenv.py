"""A container's environment, as kubelet builds it."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Any

Obj = dict[str, Any]
Lookup = Callable[[str, str], Obj | None]  # (kind, name) -> ConfigMap/Secret in the pod's namespace

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class EnvError(RuntimeError):
    """A referenced ConfigMap/Secret/key is missing (the pod must wait)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ is $."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(sub, text)


def field_value(pod: Obj, path: str) -> str:
    """The value of a downward-API fieldRef path for this pod."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs", [])),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs", [])),
    }
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1], {})
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    if path not in simple:
        raise EnvError(f"fieldRef {path!r} is not supported by the e2e agent")
    return str(simple[path] or "")


def resource_value(container: Obj, ref: Obj, node_capacity: Mapping[str, str]) -> str:
    """resourceFieldRef: the container's limit (else the node's capacity), in divisor units."""
    resource = ref["resource"]
    kind, _, name = resource.partition(".")
    value = container.get("resources", {}).get(kind, {}).get(name) or node_capacity.get(name, "0")
    number = quantity(value)
    divisor = quantity(ref.get("divisor", "1"))
    return str(max(1, int(-(-number // divisor))) if number else 0)


_SUFFIX = {
    "m": 0.001, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}


def quantity(text: str) -> float:
    """A resource quantity ("1Gi", "500m", "2") as a number."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not m or (m.group(2) and m.group(2) not in _SUFFIX):
        raise EnvError(f"cannot read the quantity {text!r}")
    return float(m.group(1)) * _SUFFIX.get(m.group(2), 1)


def _data(obj: Obj, kind: str) -> dict[str, str]:
    if kind == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
    merged = dict(obj.get("data", {}))
    merged.update({k: base64.b64decode(v).decode() for k, v in obj.get("binaryData", {}).items()})
    return merged


def _key_ref(ref: Obj, kind: str, lookup: Lookup) -> str | None:
    obj = lookup(kind, ref["name"])
    optional = bool(ref.get("optional"))
    if obj is None:
        if optional:
            return None
        raise EnvError(f"{kind} {ref['name']!r} not found")
    data = _data(obj, kind)
    if ref["key"] not in data:
        if optional:
            return None
        raise EnvError(f"{kind} {ref['name']!r} has no key {ref['key']!r}")
    return data[ref["key"]]


def container_env(
    pod: Obj,
    container: Obj,
    lookup: Lookup,
    *,
    base: Mapping[str, str],
    node_capacity: Mapping[str, str],
) -> dict[str, str]:
    """base (image and service env) < envFrom < env, with $(VAR) expansion."""
    env = dict(base)
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if field in source:
                ref = source[field]
                obj = lookup(kind, ref["name"])
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise EnvError(f"{kind} {ref['name']!r} (envFrom) not found")
                for key, data in _data(obj, kind).items():
                    env[prefix + key] = data
    for var in container.get("env", []):
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            value = resource_value(container, source["resourceFieldRef"], node_capacity)
        elif "secretKeyRef" in source:
            value = _key_ref(source["secretKeyRef"], "Secret", lookup)
        elif "configMapKeyRef" in source:
            value = _key_ref(source["configMapKeyRef"], "ConfigMap", lookup)
        else:
            raise EnvError(f"env {name!r}: unsupported valueFrom {sorted(source)}")
        if value is not None:
            env[name] = value
    return env


def file_data(obj: Obj, kind: str) -> dict[str, bytes]:
    """ConfigMap/Secret contents as bytes, for volumes."""
    if kind == "Secret":
        return {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
    out = {k: v.encode() for k, v in obj.get("data", {}).items()}
    out.update({k: base64.b64decode(v) for k, v in obj.get("binaryData", {}).items()})
    return out
