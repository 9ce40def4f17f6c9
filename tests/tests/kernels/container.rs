//! The container of the unstable kernel's guest: made as a runtime makes one, profiled from the
//! guest's host, and checked (see `kernels.rs`).

use std::path::Path;

use tachyon_bpf_tests::*;

use super::{short_of_merged, Guest};

/// The container id the guest's container runs under (`docker-<id>.scope`, as Docker's systemd
/// driver names it).
pub const CONTAINER_ID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

/// A container in the guest, made as a runtime makes one: Debian 13's root (`.tools/releases`,
/// another release than this machine's), its own pid and mount namespaces, its own cgroup
/// named as Docker names its scopes, `OTEL_SERVICE_NAME` set and nothing else of the
/// environment; its python3.13 runs `work.py busy` from the root's `/mnt`. Profiled from the
/// guest's host with `--all-pythons`. (In the guest, whose cgroups are ours alone.)
pub fn container_script(bin: &Path) -> String {
    let root = tools_dir().join("releases/trixie");
    assert!(
        root.join(".complete").exists(),
        "{} is missing: run the tests with `cargo xtask test`",
        root.display()
    );
    let otlp_python = tools_dir().join("otlp/venv/bin/python");
    assert!(
        otlp_python.exists(),
        "{} is missing: run the tests with `cargo xtask test`",
        otlp_python.display()
    );
    let (bin, root, otlp_python) = (bin.display(), root.display(), otlp_python.display());
    format!(
        r#"CG=/sys/fs/cgroup/system.slice/docker-{CONTAINER_ID}.scope
# The run's profile also goes to an OTLP receiver in the guest (PyPI's generated code).
ip link set lo up 2> $R/otlp.lo
{otlp_python} $R/receiver.py $R/otlp.jsonl > $R/otlp.port 2> $R/otlp.err & RX=$!
for i in $(seq 50); do [ -s $R/otlp.port ] && break; sleep 0.2; done
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2> $R/container.mount
mkdir -p $CG
sh -c "echo \$\$ > $CG/cgroup.procs && exec /usr/bin/unshare --pid --mount --fork --kill-child /bin/sh -c '/bin/mount --bind $R {root}/mnt && exec /usr/sbin/chroot {root} /usr/bin/env -i OTEL_SERVICE_NAME=cart PATH=/usr/bin:/bin /usr/bin/python3.13 /mnt/work.py busy 120'" > $R/container.out 2>&1 & C=$!
sleep 3
cat $CG/cgroup.procs > $R/container.procs
{bin} -v -r $RATE --all-pythons -m cpu -d 4 -o $R/container.json --otlp http://127.0.0.1:$(cat $R/otlp.port) 2> $R/container.err; echo $? > $R/container.rc
kill $RX
# unshare --fork ignores SIGTERM while it waits; its child dies with it (--kill-child).
kill -KILL $C
wait
"#
    )
}

/// What is wrong with the container run (`container_script`).
pub fn check_container(g: &Guest, dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut fail = |e: String| {
        errors.push(format!(
            "kernel {} ({}), the container: {e}",
            g.label, g.kernel_release
        ))
    };
    if read("container.rc").trim() != "0" {
        fail(format!(
            "the run failed: {}\nmount: {}\ncontainer: {}\nprocs: {}",
            read("container.err"),
            read("container.mount"),
            read("container.out"),
            read("container.procs")
        ));
        return errors;
    }
    let json = dir.join("container.json");
    let v = match Viewer::load(&json) {
        Ok(v) => v,
        Err(e) => {
            fail(format!("container.json does not load: {e}"));
            return errors;
        }
    };
    let procs = v.processes().unwrap();
    // The track says which service and container; the version is the container's python3.13,
    // which this machine does not have.
    let short = &CONTAINER_ID[..12];
    let Some(p) = procs.iter().find(|p| p.name.contains("work.py")) else {
        fail(format!(
            "no work.py process: {:?}",
            procs.iter().map(|p| &p.name).collect::<Vec<_>>()
        ));
        return errors;
    };
    if !p.name.contains("Python 3.13")
        || !p
            .name
            .contains(&format!("[service cart, container {short}]"))
    {
        fail(format!("the process track is named {:?}", p.name));
    }
    // Python frames of the container's /mnt/work.py, merged into the native stacks of the
    // container's own libpython (symbols read through /proc/PID/root).
    if let Some(e) = short_of_merged(&v, std::slice::from_ref(p), "leaf", "container") {
        fail(e);
    }
    let gecko: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let meta = gecko["meta"]["tachyon"]["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(m) = meta
        .iter()
        .find(|m| m["name"].as_str().is_some_and(|n| n.contains("work.py")))
    else {
        fail(format!("no identity of work.py in the metadata: {meta:?}"));
        return errors;
    };
    // Its pid is the host's, with its own (1: the namespace's first) beside it.
    let want = [
        ("containerId", serde_json::json!(CONTAINER_ID)),
        ("service", serde_json::json!("cart")),
        ("serviceSource", serde_json::json!("otel")),
        ("nsPid", serde_json::json!(1)),
        ("executable", serde_json::json!("/usr/bin/python3.13")),
    ];
    for (k, v) in want {
        if m[k] != v {
            fail(format!("{k} is {}, not {v}: {m}", m[k]));
        }
    }
    if m["pid"].as_u64().is_none_or(|pid| pid <= 1) || p.pid == "1" {
        fail(format!("the pid is not the host's: {m}"));
    }
    if m["labels"]["container_id"] != CONTAINER_ID || m["labels"]["service_name"] != "cart" {
        fail(format!("the labels: {m}"));
    }
    errors.extend(check_container_otlp(g, dir, m));
    errors.extend(check_container_files(g, &json, m));
    errors
}

/// The container's profile over OTLP, as the receiver decoded it: its resource (`m`: the
/// process's identity in the Gecko profile's metadata).
fn check_container_otlp(g: &Guest, dir: &Path, m: &serde_json::Value) -> Vec<String> {
    let mut errors = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut fail = |e: String| {
        errors.push(format!(
            "kernel {} ({}), the container: {e}",
            g.label, g.kernel_release
        ))
    };
    let otlp = read("otlp.jsonl");
    let req: Option<serde_json::Value> = otlp
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok());
    let res = req.as_ref().and_then(|r| {
        r["processes"]
            .as_array()?
            .iter()
            .find(|p| p["attrs"]["service.name"] == "cart")
            .cloned()
    });
    match res {
        None => fail(format!(
            "no OTLP resource of the service cart: {otlp}\nreceiver: {}{}",
            read("otlp.err"),
            read("otlp.lo")
        )),
        Some(r) => {
            let at = &r["attrs"];
            if at["container.id"] != CONTAINER_ID
                || at["process.pid"] != m["pid"]
                || at["process.executable.path"] != "/usr/bin/python3.13"
                || !r["frames"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f[0] == "leaf" && f[1] == "/mnt/work.py"))
            {
                fail(format!("the OTLP resource: {r}"));
            }
        }
    }
    errors
}

/// The container's frames in the Gecko profile `json` name its own `/mnt/work.py`.
fn check_container_files(guest: &Guest, json: &Path, m: &serde_json::Value) -> Vec<String> {
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let files: Vec<String> = g["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["pid"] == m["pid"].to_string().as_str())
        .flat_map(|t| {
            let strings = &g["shared"]["stringArray"];
            t["funcTable"]["fileName"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| strings[i.as_u64()? as usize].as_str().map(String::from))
                .collect::<Vec<_>>()
        })
        .collect();
    if files.iter().any(|f| f == "/mnt/work.py") {
        return Vec::new();
    }
    vec![format!(
        "kernel {} ({}), the container: no frame of the container's /mnt/work.py: {files:?}",
        guest.label, guest.kernel_release
    )]
}
