//! `ipc://` endpoints: where the defaults live, and what binding one needs.
//!
//! Every process defaults to ipc endpoints in one private runtime directory ([`runtime_dir`]),
//! as the systemd units do (`/run/specula`, 0750): only the user (and the unit's group) can
//! reach them, where a default tcp port would let any local user connect. The binding process
//! creates the directory 0700 when it is missing.
//!
//! A killed process (`kill -9`) leaves its socket file behind, and a restarted one could then
//! never bind again: such a stale file is removed, but never one a live process listens on.

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::LinkError;

/// The directory of the default endpoints: `$SPECULA_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/specula` (per user, created by the login manager 0700), else
/// `/tmp/specula-<uid>` ([`fallback_dir`], whose owner and mode are checked before use).
pub fn runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPECULA_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("specula");
    }
    fallback_dir()
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `/tmp/specula-<uid>`: in a directory every local user can write, so another user could
/// create it first and listen on our endpoints; it is used only if we own it and nobody else
/// may enter it ([`check_endpoint_dir`]).
pub fn fallback_dir() -> PathBuf {
    std::env::temp_dir().join(format!("specula-{}", uid()))
}

/// Refuses an ipc endpoint in [`fallback_dir`] unless that directory is ours, a real directory
/// (not a link), and closed to group and others (mode 0700).
pub fn check_endpoint_dir(endpoint: &str) -> Result<(), LinkError> {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = endpoint
        .strip_prefix("ipc://")
        .and_then(|p| Path::new(p).parent())
    else {
        return Ok(());
    };
    if dir != fallback_dir() {
        return Ok(());
    }
    let unsafe_dir = |reason: String| LinkError::UnsafeRuntimeDir {
        dir: dir.to_owned(),
        reason,
    };
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        // Not there yet: the binder creates it 0700.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(unsafe_dir(e.to_string())),
    };
    if !meta.file_type().is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    if meta.uid() != uid() {
        return Err(unsafe_dir(format!(
            "it belongs to uid {}, not to us ({})",
            meta.uid(),
            uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_dir(format!(
            "its mode is {:o}; it must be 0700",
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

/// The default endpoint `name` (e.g. `tp-ingest`): `ipc://<runtime_dir>/<name>.sock`.
pub fn default_endpoint(name: &str) -> String {
    format!("ipc://{}/{name}.sock", runtime_dir().display())
}

// Where the three processes meet by default, named once so that both ends of each link agree.

/// The first engine-worker's api endpoint (its ROUTER; api-servers connect).
pub fn default_worker_endpoint() -> String {
    default_endpoint("worker-0")
}

/// The token-processor's ingest endpoint (its ROUTER; engine-workers connect).
pub fn default_tp_ingest_endpoint() -> String {
    default_endpoint("tp-ingest")
}

/// The token-processor's endpoint for api-servers (its ROUTER; api-servers connect).
pub fn default_tp_api_endpoint() -> String {
    default_endpoint("tp-api")
}

/// Before binding `endpoint`: creates its directory (0700) when missing, and deletes its socket
/// file if nobody accepts connections on it.
pub fn prepare_bind(endpoint: &str) -> Result<(), LinkError> {
    let Some(path) = endpoint.strip_prefix("ipc://") else {
        return Ok(());
    };
    let path = Path::new(path);
    let err = |source| LinkError::Endpoint {
        endpoint: endpoint.to_owned(),
        source,
    };
    check_endpoint_dir(endpoint)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    // Created by someone else between the check and here: checked again.
    check_endpoint_dir(endpoint)?;
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
        let err = prepare_bind(&endpoint).unwrap_err();
        assert!(matches!(err, LinkError::EndpointInUse { .. }), "{err}");
        drop(live); // the file stays behind, as after kill -9
        assert!(path.exists());
        prepare_bind(&endpoint).unwrap();
        assert!(!path.exists());
        prepare_bind("tcp://127.0.0.1:1").unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn creates_a_missing_directory_private_to_the_user() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("link-ipc-dir-{}", std::process::id()));
        let endpoint = format!("ipc://{}/a/b.sock", dir.display());
        prepare_bind(&endpoint).unwrap();
        let mode = std::fs::metadata(dir.join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The fallback directory is refused with a wider mode (as another user could have made
    /// it), and taken once it is private. (Another owner cannot be made without root; the
    /// check is the same comparison.)
    #[test]
    fn the_fallback_directory_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = fallback_dir();
        let existed = dir.exists();
        std::fs::create_dir_all(&dir).unwrap();
        let before = std::fs::metadata(&dir).unwrap().permissions();
        let endpoint = format!("ipc://{}/x.sock", dir.display());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_endpoint_dir(&endpoint).unwrap_err();
        assert!(matches!(err, LinkError::UnsafeRuntimeDir { .. }), "{err}");
        assert!(err.to_string().contains("777"), "{err}");
        assert!(prepare_bind(&endpoint).is_err(), "a binder refuses it too");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        check_endpoint_dir(&endpoint).unwrap();
        // Other directories are the operator's choice.
        check_endpoint_dir("ipc:///run/specula/x.sock").unwrap();
        if existed {
            std::fs::set_permissions(&dir, before).unwrap();
        } else {
            std::fs::remove_dir_all(&dir).ok();
        }
    }

    #[test]
    fn default_endpoints_are_ipc_in_the_runtime_directory() {
        let endpoint = default_endpoint("tp-ingest");
        assert!(endpoint.starts_with("ipc://"), "{endpoint}");
        assert!(endpoint.ends_with("/tp-ingest.sock"), "{endpoint}");
        assert!(endpoint.contains(&runtime_dir().display().to_string()));
    }
}
