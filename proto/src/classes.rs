//! Request classes: the operator's bounded set of workload names (`code`, `chat`, ...) that
//! label the token-processor's acceptance series. The api-server resolves a request's class
//! (a header the operator names, or `metadata.class`) against its configured set and the
//! token-processor again against its own; a name not configured counts as `other`, so the
//! series' cardinality is bounded by configuration, never by clients. One rule, both processes.

/// The class of every request whose class is not configured (or that named none).
pub const OTHER_CLASS: &str = "other";

/// Most configured classes (each one multiplies the acceptance series of every worker).
pub const MAX_REQUEST_CLASSES: usize = 32;

/// Longest class name, in bytes.
pub const MAX_CLASS_NAME_BYTES: usize = 64;

/// The configured classes, `other` first at index 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestClasses {
    names: Vec<String>,
}

impl Default for RequestClasses {
    fn default() -> Self {
        Self {
            names: vec![OTHER_CLASS.to_owned()],
        }
    }
}

impl RequestClasses {
    /// The classes `configured` names (duplicates and `other` are taken once), or why not:
    /// more than [`MAX_REQUEST_CLASSES`], or a name that is not a short lowercase label value.
    pub fn new(configured: &[String]) -> Result<Self, String> {
        let mut classes = Self::default();
        for name in configured {
            check_class_name(name)?;
            if !classes.names.contains(name) {
                classes.names.push(name.clone());
            }
        }
        if classes.names.len() > MAX_REQUEST_CLASSES + 1 {
            return Err(format!(
                "{} request classes configured; at most {MAX_REQUEST_CLASSES}",
                classes.names.len() - 1
            ));
        }
        Ok(classes)
    }

    /// The index of `name`: its own when configured, else `other`'s (0).
    pub fn index_of(&self, name: &str) -> u8 {
        self.names
            .iter()
            .position(|n| n == name)
            .map_or(0, |i| i as u8)
    }

    /// `name` if it is configured, else `other`.
    pub fn resolve(&self, name: &str) -> &str {
        &self.names[usize::from(self.index_of(name))]
    }

    /// Classes, `other` included.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Every class name, `other` first.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Ok when `name` can be a class: 1 to [`MAX_CLASS_NAME_BYTES`] bytes of `a-z`, `0-9`, `_`, `-`.
pub fn check_class_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_CLASS_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    match valid {
        true => Ok(()),
        false => Err(format!(
            "request class {name:?} must be 1 to {MAX_CLASS_NAME_BYTES} characters of a-z, 0-9, _ and -"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(names: &[&str]) -> Result<RequestClasses, String> {
        RequestClasses::new(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn unknown_and_missing_classes_count_as_other() {
        let c = classes(&["code", "chat", "code", "other"]).unwrap();
        assert_eq!(c.names(), ["other", "code", "chat"]);
        assert_eq!(c.index_of("code"), 1);
        assert_eq!(c.index_of("chat"), 2);
        assert_eq!(c.index_of(""), 0);
        assert_eq!(c.index_of("Code"), 0);
        assert_eq!(c.index_of("anything-a-client-says"), 0);
        assert_eq!(RequestClasses::default().names(), ["other"]);
        assert_eq!(c.resolve("chat"), "chat");
        assert_eq!(c.resolve("sql"), "other");
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(classes(&["has space"]).is_err());
        assert!(classes(&["UPPER"]).is_err());
        assert!(classes(&[""]).is_err());
        assert!(classes(&[&"x".repeat(65)]).is_err());
        let many: Vec<String> = (0..33).map(|i| format!("c{i}")).collect();
        assert!(RequestClasses::new(&many).is_err());
        assert!(RequestClasses::new(&many[..32]).is_ok());
    }
}
