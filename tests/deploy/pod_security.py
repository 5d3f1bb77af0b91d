"""The Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards), as
Pod Security Admission applies them to a pod spec: `level(spec, annotations)` is the least
privileged level the pod passes — "restricted", "baseline" or "privileged" — with the reasons it
fails the levels below. Each control is the standard's (its restricted fields and allowed
values); the user-namespace relaxations of newer clusters are not applied, so a pod that passes
here passes on every supported Kubernetes."""

from __future__ import annotations

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def _containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def baseline_violations(spec: dict, annotations: dict | None = None) -> list[str]:
    out = []
    psc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"{field}: true")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("hostProcess")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            out.append(f"hostPath volume {v.get('name')}")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (value == "runtime/default" or value.startswith("localhost/")):
            out.append(f"AppArmor {value} ({key.rsplit('/', 1)[1]})")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("seccomp Unconfined (pod)")
    if psc.get("seLinuxOptions", {}).get("type") not in SELINUX_TYPES or psc.get("seLinuxOptions", {}).get("user") or psc.get("seLinuxOptions", {}).get("role"):
        out.append("SELinux options (pod)")
    for s in psc.get("sysctls", []):
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {s.get('name')}")
    if ((psc.get("appArmorProfile") or {}).get("type")) == "Unconfined":
        out.append("AppArmor Unconfined (pod)")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        name = c.get("name")
        if sc.get("privileged"):
            out.append(f"privileged ({name})")
        extra = set((sc.get("capabilities") or {}).get("add", [])) - BASELINE_CAPABILITIES
        if extra:
            out.append(f"capabilities {sorted(extra)} ({name})")
        for p in c.get("ports", []):
            if p.get("hostPort"):
                out.append(f"hostPort {p['hostPort']} ({name})")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"procMount {sc['procMount']} ({name})")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"seccomp Unconfined ({name})")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"AppArmor Unconfined ({name})")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"hostProcess ({name})")
        if sc.get("seLinuxOptions", {}).get("type") not in SELINUX_TYPES:
            out.append(f"SELinux type ({name})")
    return out


def restricted_violations(spec: dict) -> list[str]:
    out = []
    psc = spec.get("securityContext") or {}
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v.get('name')} of type {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        out.append("runAsUser 0 (pod)")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        name = c.get("name")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"allowPrivilegeEscalation not false ({name})")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"runAsNonRoot not true ({name})")
        if sc.get("runAsUser") == 0:
            out.append(f"runAsUser 0 ({name})")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccomp {seccomp} ({name})")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            out.append(f"capabilities not dropping ALL ({name})")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"capabilities added {sorted(set(caps.get('add', [])) - {'NET_BIND_SERVICE'})} ({name})")
    return out


def level(spec: dict, annotations: dict | None = None) -> tuple[str, list[str]]:
    """(the least privileged level the pod passes, why it fails the level below it)."""
    base = baseline_violations(spec, annotations)
    if base:
        return "privileged", base
    restricted = restricted_violations(spec)
    return ("baseline", restricted) if restricted else ("restricted", [])


def pods(docs: list[dict]) -> list[tuple[str, dict, dict]]:
    """(kind/name, pod spec, pod annotations) of every pod a rendered chart makes."""
    out = []
    for d in docs:
        if d["kind"] == "Pod":
            out.append((f"Pod/{d['metadata']['name']}", d["spec"], d["metadata"].get("annotations") or {}))
        elif d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
            t = d["spec"]["template"]
            out.append((f"{d['kind']}/{d['metadata']['name']}", t["spec"], (t.get("metadata") or {}).get("annotations") or {}))
        elif d["kind"] == "CronJob":
            t = d["spec"]["jobTemplate"]["spec"]["template"]
            out.append((f"CronJob/{d['metadata']['name']}", t["spec"], (t.get("metadata") or {}).get("annotations") or {}))
    return out
