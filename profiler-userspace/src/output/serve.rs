//! `--open`: serves a Gecko profile to profiler.firefox.com from 127.0.0.1, at an unguessable
//! path, with CORS for that origin only, until Ctrl-C.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const ORIGIN: &str = "https://profiler.firefox.com";

/// Connections served at once: a fixed pool, however many clients connect. (Hand-written on
/// std's listener because tiny_http, used before, starts a thread per connection with no limit:
/// 4,000 idle connections made 2,800 threads.)
const WORKERS: usize = 8;
/// How long a connection may take to send its request, and to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head read.
const MAX_HEAD: usize = 8192;

/// A running server: the from-url link, and the threads serving it.
pub struct Served {
    pub link: String,
    stop: Arc<AtomicBool>,
    port: u16,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake workers blocked in accept so they end. They are not joined: one held by an idle
        // client ends within IO_TIMEOUT on its own, and ending serving must not wait for that
        // (the process exits right after).
        for _ in 0..self.threads.len() {
            let _ = TcpStream::connect_timeout(
                &([127, 0, 0, 1], self.port).into(),
                Duration::from_millis(50),
            );
        }
        self.threads.clear();
    }
}

/// Reads a request head (bounded in size and time) and returns (method, path).
fn read_head(s: &mut TcpStream) -> Option<(String, String)> {
    s.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    s.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let t0 = std::time::Instant::now();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= MAX_HEAD || t0.elapsed() > IO_TIMEOUT {
            return None;
        }
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut first = text.lines().next()?.split_whitespace();
    Some((first.next()?.to_string(), first.next()?.to_string()))
}

fn respond(s: &mut TcpStream, status: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
}

fn serve_one(mut s: TcpStream, path: &str, profile: &[u8]) {
    let Some((method, url)) = read_head(&mut s) else {
        return;
    };
    let cors = [("Access-Control-Allow-Origin", ORIGIN), ("Vary", "Origin")];
    if url != path {
        respond(&mut s, "404 Not Found", &[], b"not found");
    } else if method == "OPTIONS" {
        let mut h = vec![("Access-Control-Allow-Methods", "GET")];
        h.extend_from_slice(&cors);
        respond(&mut s, "204 No Content", &h, b"");
    } else if method == "GET" {
        // Sized, not chunked: the profiler shows download progress from Content-Length.
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(&cors);
        respond(&mut s, "200 OK", &h, profile);
    } else {
        respond(&mut s, "405 Method Not Allowed", &[], b"");
    }
}

/// Starts serving `profile` (Gecko JSON bytes) on a free port of 127.0.0.1.
pub fn start(profile: Vec<u8>) -> Result<Served, super::Error> {
    let failed = |e: std::io::Error| {
        let message = format!("cannot serve the profile on 127.0.0.1: {e}");
        super::Error::caused(super::ErrorKind::Output, message, e)
    };
    let listener = TcpListener::bind("127.0.0.1:0").map_err(failed)?;
    let port = listener.local_addr().map(|a| a.port()).map_err(failed)?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let path = format!("/{token}/profile.json");
    let url = format!("http://127.0.0.1:{port}{path}");
    // The URL goes inside the profiler's URL path: encoded whole.
    let link = format!("{ORIGIN}/from-url/{}/", super::percent_encode(&url));
    let stop = Arc::new(AtomicBool::new(false));
    let profile: Arc<[u8]> = profile.into();
    let mut threads = Vec::new();
    for _ in 0..WORKERS {
        let l = listener.try_clone().map_err(failed)?;
        let (stop, path, profile) = (stop.clone(), path.clone(), profile.clone());
        threads.push(std::thread::spawn(move || {
            for conn in l.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(s) = conn {
                    serve_one(s, &path, &profile);
                }
            }
        }));
    }
    Ok(Served {
        link,
        stop,
        port,
        threads,
    })
}

/// Asks a desktop browser to open `link`, as the user who ran sudo when there is one (never a
/// browser as root), and only where a display exists. Failures are silent: the link is printed.
pub fn try_browser(link: &str) {
    let has_display =
        std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
    if !has_display {
        return;
    }
    let mut cmd = match std::env::var("SUDO_USER") {
        Ok(user) if !user.is_empty() && nix::unistd::geteuid().is_root() => {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", &user, "--", "xdg-open", link]);
            c
        }
        _ => {
            let mut c = std::process::Command::new("xdg-open");
            c.arg(link);
            c
        }
    };
    let _ = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    std::thread::sleep(Duration::from_millis(10));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(url_path: &str, port: u16, method: &str) -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "{method} {url_path} HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {ORIGIN}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn idle_connections_take_no_more_than_the_pool() {
        let served = start(b"{}".to_vec()).unwrap();
        let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let before = threads();
        // Many connections that never send a request (fewer than the listen backlog, past
        // which connecting itself waits for the pool to get through the idle ones).
        let idle: Vec<TcpStream> = (0..100)
            .filter_map(|_| TcpStream::connect(("127.0.0.1", served.port)).ok())
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            threads() <= before + 2,
            "{} threads, {} before",
            threads(),
            before
        );
        drop(idle);
        drop(served);
    }

    #[test]
    fn serves_only_its_path_with_cors_for_the_profiler() {
        let served = start(b"{\"meta\":{}}".to_vec()).unwrap();
        let enc = served
            .link
            .strip_prefix("https://profiler.firefox.com/from-url/")
            .unwrap()
            .trim_end_matches('/');
        let url = enc.replace("%3A", ":").replace("%2F", "/");
        let rest = url.strip_prefix("http://127.0.0.1:").unwrap();
        let (port, path) = rest.split_once('/').unwrap();
        let port: u16 = port.parse().unwrap();
        let path = format!("/{path}");
        assert!(path.len() > 32, "unguessable path: {path}");
        let ok = get(&path, port, "GET");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("Access-Control-Allow-Origin: https://profiler.firefox.com"));
        assert!(ok.ends_with("{\"meta\":{}}"));
        let pre = get(&path, port, "OPTIONS");
        assert!(pre.starts_with("HTTP/1.1 204"), "{pre}");
        let other = get("/profile.json", port, "GET");
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        assert!(!other.contains("Access-Control-Allow-Origin"));
    }
}
