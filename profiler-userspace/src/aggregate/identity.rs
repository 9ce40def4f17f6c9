//! Who a process is in a fleet: its service, container, Kubernetes pod and systemd unit, made
//! from what `process::identity` reads once per process (per program, after an exec) of
//! `/proc/PID/cgroup`, `/proc/PID/status` and the few variables of `/proc/PID/environ` that are
//! asked for. A backend groups and filters profiles by these, where a pid means nothing.
//!
//! The service name is the first found of: `OTEL_SERVICE_NAME`; `service.name` in
//! `OTEL_RESOURCE_ATTRIBUTES`; `PYROSCOPE_APPLICATION_NAME`; the systemd service the process
//! runs in; the machine or container name the cgroup path gives (systemd-nspawn, machined);
//! the program (a Python script or `-m` module, else the command name).
//!
//! Container ids are read from the cgroup path as Docker, containerd, CRI-O and podman name
//! their cgroups, with the cgroupfs and the systemd drivers, v1 and v2: a 64-hex-digit
//! component, bare (`/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`) or in a scope
//! (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
//! `libpod-<id>.scope`). Hand-written: no crate reads these paths, and the rules are a few lines.

use serde::{Deserialize, Serialize};

/// Longest value kept of a variable or a name.
pub const VALUE_MAX: usize = 256;

/// Where a service name came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ServiceSource {
    /// `OTEL_SERVICE_NAME`, or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`.
    Otel,
    /// `PYROSCOPE_APPLICATION_NAME`.
    Pyroscope,
    /// The systemd service the process runs in.
    Systemd,
    /// The machine or container the cgroup path names.
    Container,
    /// The program: its script, `-m` module or command name.
    #[default]
    Program,
}

impl ServiceSource {
    pub fn name(self) -> &'static str {
        match self {
            ServiceSource::Otel => "otel",
            ServiceSource::Pyroscope => "pyroscope",
            ServiceSource::Systemd => "systemd",
            ServiceSource::Container => "container",
            ServiceSource::Program => "program",
        }
    }

    /// The source `name` names (`Program` for a name this version does not know).
    pub fn from_name(name: &str) -> ServiceSource {
        match name {
            "otel" => ServiceSource::Otel,
            "pyroscope" => ServiceSource::Pyroscope,
            "systemd" => ServiceSource::Systemd,
            "container" => ServiceSource::Container,
            _ => ServiceSource::Program,
        }
    }
}

/// A process's identity in a fleet (see the module's documentation).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    pub service: String,
    pub service_source: ServiceSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub systemd_unit: Option<String>,
    /// The process's cgroup (v2, or v1's systemd hierarchy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Its pid in its own pid namespace, when that is not the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    /// The executable's path, as the kernel gives it (inside a container: the container's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,
    /// The environment variables `--env-label` names that the process has, in that order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

impl Identity {
    /// The identity of what was read (`env`: the variables found, as `NAME`, `VALUE`).
    pub fn from_parts(
        cgroup: &str,
        status: &str,
        env: &[(String, String)],
        executable: Option<String>,
        program: &str,
        env_labels: &[String],
    ) -> Identity {
        let var = |name: &str| {
            env.iter()
                .find(|(n, v)| n == name && !v.trim().is_empty())
                .map(|(_, v)| v.trim().to_string())
        };
        let path = cgroup_path(cgroup);
        let parts = path.as_deref().map(parse_cgroup).unwrap_or_default();
        let (service, service_source) = if let Some(s) = var("OTEL_SERVICE_NAME") {
            (s, ServiceSource::Otel)
        } else if let Some(s) = var("OTEL_RESOURCE_ATTRIBUTES").and_then(|a| otel_service(&a)) {
            (s, ServiceSource::Otel)
        } else if let Some(s) = var("PYROSCOPE_APPLICATION_NAME") {
            (s, ServiceSource::Pyroscope)
        } else if let Some(u) = &parts.unit {
            (
                u.strip_suffix(".service").unwrap_or(u).to_string(),
                ServiceSource::Systemd,
            )
        } else if let Some(m) = &parts.machine {
            (m.clone(), ServiceSource::Container)
        } else {
            (program.to_string(), ServiceSource::Program)
        };
        Identity {
            service: bounded(&service),
            service_source,
            container_id: parts.container_id,
            pod_uid: parts.pod_uid,
            systemd_unit: parts.unit,
            cgroup: path.map(|p| bounded(&p)),
            ns_pid: ns_pid(status),
            executable,
            env: env_labels
                .iter()
                .filter_map(|n| var(n).map(|v| (n.clone(), bounded(&v))))
                .collect(),
        }
    }

    /// The identity as labels, in a fixed order: `service_name`, then what is known of
    /// `container_id`, `pod_uid`, `systemd_unit`, then the `--env-label` variables by their
    /// names. Names follow Pyroscope's and Prometheus's rules (`[a-zA-Z_][a-zA-Z0-9_]*`).
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut out = vec![("service_name".to_string(), self.service.clone())];
        let optional = [
            ("container_id", &self.container_id),
            ("pod_uid", &self.pod_uid),
            ("systemd_unit", &self.systemd_unit),
        ];
        for (k, v) in optional {
            if let Some(v) = v {
                out.push((k.to_string(), v.clone()));
            }
        }
        for (k, v) in &self.env {
            out.push((label_name(k), v.clone()));
        }
        out
    }
}

/// A label name as Pyroscope and Prometheus accept it: `[a-zA-Z_][a-zA-Z0-9_]*`, other
/// characters replaced by `_`.
pub fn label_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// At most `VALUE_MAX` bytes of `s` (at a character boundary), without control characters.
fn bounded(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > VALUE_MAX {
            break;
        }
        out.push(c);
    }
    out
}

/// `service.name` in `OTEL_RESOURCE_ATTRIBUTES` (`key=value,key=value`, values
/// percent-encoded).
fn otel_service(attrs: &str) -> Option<String> {
    attrs.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == "service.name" && !v.trim().is_empty()).then(|| percent_decode(v.trim()))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The process's cgroup path: the v2 line (`0::/...`), else v1's systemd hierarchy, else the
/// first v1 line's.
fn cgroup_path(cgroup: &str) -> Option<String> {
    let mut lines = cgroup.lines().filter_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, controllers, path) = (f.next()?, f.next()?, f.next()?);
        Some((id, controllers, path))
    });
    let all: Vec<_> = lines.by_ref().collect();
    let pick = all
        .iter()
        .find(|(id, c, _)| *id == "0" && c.is_empty())
        .or_else(|| all.iter().find(|(_, c, _)| *c == "name=systemd"))
        .or_else(|| all.iter().find(|(_, _, p)| *p != "/"))
        .or_else(|| all.first())?;
    Some(pick.2.to_string())
}

#[derive(Default, Debug, PartialEq)]
struct CgroupParts {
    container_id: Option<String>,
    pod_uid: Option<String>,
    unit: Option<String>,
    machine: Option<String>,
}

/// `8-4-4-4-12` hex digits.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(j, b)| {
            let dash = matches!(j, 8 | 13 | 18 | 23);
            if dash {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        })
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a cgroup path says (see the module's documentation).
fn parse_cgroup(path: &str) -> CgroupParts {
    let mut out = CgroupParts::default();
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        let scope = comp.strip_suffix(".scope").unwrap_or(comp);
        let id = [
            "docker-",
            "cri-containerd-",
            "crio-",
            "libpod-",
            "containerd-",
        ]
        .iter()
        .find_map(|p| scope.strip_prefix(p))
        .unwrap_or(scope);
        if is_container_id(id) {
            out.container_id = Some(id.to_ascii_lowercase());
            continue;
        }
        // `pod<uid>` (cgroupfs) or `kubepods-<class>-pod<uid with _>.slice` (systemd).
        if let Some(i) = comp.rfind("pod") {
            let uid = comp[i + 3..]
                .strip_suffix(".slice")
                .unwrap_or(&comp[i + 3..]);
            let uid = uid.replace('_', "-");
            if is_uuid(&uid) {
                out.pod_uid = Some(uid.to_ascii_lowercase());
                continue;
            }
        }
        if let Some(m) = comp
            .strip_prefix("machine-")
            .and_then(|m| m.strip_suffix(".scope"))
        {
            // systemd-nspawn and machined: `machine-NAME.scope`, the name escaped (`\x2d`).
            out.machine = Some(m.replace("\\x2d", "-"));
            continue;
        }
        if let Some(u) = comp.strip_suffix(".service") {
            // The user's own service manager is not a service of the host's.
            if !u.starts_with("user@") && !u.is_empty() {
                out.unit = Some(comp.to_string());
            }
        }
    }
    // A container's processes in a unit of their own runtime's (`docker.service`) are not that
    // service.
    if out.container_id.is_some() {
        out.unit = None;
    }
    out
}

/// The pid in the process's own pid namespace (`NSpid`'s last field), when it has one.
fn ns_pid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Vec<u32> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    (ids.len() > 1).then(|| *ids.last().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn container_ids_of_every_runtime_and_driver() {
        for path in [
            format!("/docker/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
            format!("/kubepods/burstable/pod0f3c1d2e-1111-4a2b-9c3d-123456789abc/{ID}"),
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c1d2e_1111_4a2b_9c3d_123456789abc.slice/cri-containerd-{ID}.scope"
            ),
            format!("/kubepods.slice/kubepods-pod0f3c1d2e_1111_4a2b_9c3d_123456789abc.slice/crio-{ID}.scope"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
        ] {
            let p = parse_cgroup(&path);
            assert_eq!(p.container_id.as_deref(), Some(ID), "{path}");
            assert_eq!(p.unit, None, "{path}");
            if path.contains("kubepods") {
                assert_eq!(
                    p.pod_uid.as_deref(),
                    Some("0f3c1d2e-1111-4a2b-9c3d-123456789abc"),
                    "{path}"
                );
            } else {
                assert_eq!(p.pod_uid, None, "{path}");
            }
        }
    }

    #[test]
    fn units_machines_and_plain_paths() {
        let p = parse_cgroup("/system.slice/checkout.service");
        assert_eq!(p.unit.as_deref(), Some("checkout.service"));
        assert_eq!(p.container_id, None);
        let p = parse_cgroup("/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope");
        assert_eq!(p, CgroupParts::default());
        let p = parse_cgroup("/machine.slice/machine-web\\x2d1.scope/payload");
        assert_eq!(p.machine.as_deref(), Some("web-1"));
        // Not ids: too short, not hex.
        assert_eq!(parse_cgroup("/docker/abc").container_id, None);
        assert_eq!(
            parse_cgroup(&format!("/x/{}", "g".repeat(64))).container_id,
            None
        );
    }

    #[test]
    fn the_v2_line_wins_then_v1s_systemd_hierarchy() {
        let v1 = format!("12:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n");
        assert_eq!(cgroup_path(&v1), Some(format!("/docker/{ID}")));
        let hybrid = "1:name=systemd:/system.slice/a.service\n0::/system.slice/b.service\n";
        assert_eq!(
            cgroup_path(hybrid).as_deref(),
            Some("/system.slice/b.service")
        );
        assert_eq!(cgroup_path(""), None);
    }

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn the_service_name_is_the_first_found() {
        let cg = "0::/system.slice/checkout.service\n";
        let id = |vars: &[(&str, &str)]| {
            let i = Identity::from_parts(cg, "", &env(vars), None, "app.py", &[]);
            (i.service, i.service_source)
        };
        assert_eq!(
            id(&[
                ("PYROSCOPE_APPLICATION_NAME", "pyro"),
                ("OTEL_SERVICE_NAME", "otel")
            ]),
            ("otel".into(), ServiceSource::Otel)
        );
        assert_eq!(
            id(&[(
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,service.name=cart%2Dapi"
            )]),
            ("cart-api".into(), ServiceSource::Otel)
        );
        assert_eq!(
            id(&[("PYROSCOPE_APPLICATION_NAME", "pyro")]),
            ("pyro".into(), ServiceSource::Pyroscope)
        );
        assert_eq!(id(&[]), ("checkout".into(), ServiceSource::Systemd));
        assert_eq!(id(&[("OTEL_SERVICE_NAME", "  ")]).1, ServiceSource::Systemd);
        let plain = Identity::from_parts("0::/\n", "", &[], None, "app.py", &[]);
        assert_eq!(
            (plain.service.as_str(), plain.service_source),
            ("app.py", ServiceSource::Program)
        );
    }

    #[test]
    fn only_the_named_variables_become_labels_bounded() {
        let long = "v".repeat(10_000);
        let got = env(&[("A", "1"), ("C", &long)]);
        let labels = vec!["C".to_string(), "MISSING".to_string()];
        let i = Identity::from_parts("", "", &got, None, "p", &labels);
        assert_eq!(i.env.len(), 1);
        assert_eq!(i.env[0].1.len(), VALUE_MAX);
    }

    #[test]
    fn namespace_pids_and_label_names() {
        assert_eq!(ns_pid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(ns_pid("NSpid:\t4242\n"), None);
        assert_eq!(label_name("DEPLOY.ENV"), "DEPLOY_ENV");
        assert_eq!(label_name("9lives"), "_9lives");
        let i = Identity {
            service: "s".into(),
            container_id: Some(ID.into()),
            env: vec![("team.name".into(), "core".into())],
            ..Default::default()
        };
        assert_eq!(
            i.labels(),
            vec![
                ("service_name".into(), "s".into()),
                ("container_id".into(), ID.into()),
                ("team_name".into(), "core".into())
            ]
        );
    }
}
