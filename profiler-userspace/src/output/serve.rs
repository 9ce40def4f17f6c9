//! `--open`: serves a Gecko profile to profiler.firefox.com from 127.0.0.1, at an unguessable
//! path, with CORS for that origin only, until Ctrl-C.

use std::time::Duration;

const ORIGIN: &str = "https://profiler.firefox.com";

fn header(k: &str, v: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).expect("static header")
}

/// A running server: the from-url link, and the thread serving it.
pub struct Served {
    pub link: String,
    stop: std::sync::Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts serving `profile` (Gecko JSON bytes) on a free port of 127.0.0.1.
pub fn start(profile: Vec<u8>) -> Result<Served, String> {
    let server = tiny_http::Server::http("127.0.0.1:0")
        .map_err(|e| format!("cannot serve the profile on 127.0.0.1: {e}"))?;
    let port = server
        .server_addr()
        .to_ip()
        .map(|a| a.port())
        .ok_or("cannot serve the profile: no local port")?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let path = format!("/{token}/profile.json");
    let url = format!("http://127.0.0.1:{port}{path}");
    // The URL goes inside the profiler's URL path: encoded whole.
    let link = format!("{ORIGIN}/from-url/{}/", super::percent_encode(&url));
    let server = std::sync::Arc::new(server);
    let srv = server.clone();
    let thread = std::thread::spawn(move || loop {
        let req = match srv.recv() {
            Ok(r) => r,
            Err(_) => return,
        };
        let cors = [
            header("Access-Control-Allow-Origin", ORIGIN),
            header("Vary", "Origin"),
        ];
        let resp = if req.url() != path {
            tiny_http::Response::from_string("not found")
                .with_status_code(404)
                .boxed()
        } else if *req.method() == tiny_http::Method::Options {
            let mut r = tiny_http::Response::empty(204)
                .with_header(header("Access-Control-Allow-Methods", "GET"))
                .boxed();
            for h in cors.clone() {
                r.add_header(h);
            }
            r
        } else if *req.method() == tiny_http::Method::Get {
            // Sized, not chunked: the profiler shows download progress from Content-Length.
            let mut r = tiny_http::Response::from_data(profile.clone())
                .with_header(header("Content-Type", "application/json"))
                .with_chunked_threshold(usize::MAX)
                .boxed();
            for h in cors.clone() {
                r.add_header(h);
            }
            r
        } else {
            tiny_http::Response::empty(405).boxed()
        };
        let _ = req.respond(resp);
    });
    Ok(Served {
        link,
        stop: server,
        thread: Some(thread),
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
    use std::io::{Read, Write};

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
