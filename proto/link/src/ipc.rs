//! `ipc://` endpoints leave their socket file behind when a process is killed (`kill -9`); a
//! restarted process could then never bind again. Remove such a stale file, but never one a live
//! process still listens on.

use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::LinkError;

/// Before binding `endpoint`: deletes its socket file if nobody accepts connections on it.
pub fn clear_stale_socket(endpoint: &str) -> Result<(), LinkError> {
    let Some(path) = endpoint.strip_prefix("ipc://") else {
        return Ok(());
    };
    let path = Path::new(path);
    if !path.exists() {
        return Ok(());
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(LinkError::EndpointInUse {
            endpoint: endpoint.to_owned(),
        }),
        Err(_) => std::fs::remove_file(path).map_err(|source| LinkError::Endpoint {
            endpoint: endpoint.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_a_dead_socket_and_keeps_a_live_one() {
        let dir = std::env::temp_dir().join(format!("link-ipc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let endpoint = format!("ipc://{}", path.display());

        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = clear_stale_socket(&endpoint).unwrap_err();
        assert!(matches!(err, LinkError::EndpointInUse { .. }), "{err}");
        drop(live); // the file stays behind, as after kill -9
        assert!(path.exists());
        clear_stale_socket(&endpoint).unwrap();
        assert!(!path.exists());
        clear_stale_socket("tcp://127.0.0.1:1").unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }
}
