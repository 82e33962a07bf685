//! A request's class, for the token-processor's acceptance series by workload: named by a
//! header the operator chooses (`--request-class-header`) or by `metadata.class`, and kept only
//! when it is one of the configured classes (`--request-classes`); anything else is `other`
//! ([`proto::classes`] holds the rule, which the token-processor applies again).

use axum::http::{HeaderMap, HeaderName};
use proto::classes::RequestClasses as Configured;

/// The configured classes and where a request names its own.
#[derive(Debug, Clone, Default)]
pub struct RequestClasses {
    configured: Configured,
    header: Option<HeaderName>,
}

impl RequestClasses {
    /// `classes` (checked: see [`proto::classes::check_class_name`]) named by `header`, when
    /// given, before `metadata.class`.
    pub fn new(classes: &[String], header: Option<&str>) -> Result<Self, String> {
        let header = match header.filter(|h| !h.is_empty()) {
            Some(name) => Some(
                HeaderName::try_from(name)
                    .map_err(|e| format!("--request-class-header {name:?}: {e}"))?,
            ),
            None => None,
        };
        Ok(Self {
            configured: Configured::new(classes)?,
            header,
        })
    }

    /// The class of a request with `headers` whose `metadata.class` is `metadata_class` ("" for
    /// none): the header's value when the header is configured and present, else the metadata's,
    /// kept if configured, else `other`.
    pub fn resolve(&self, headers: &HeaderMap, metadata_class: &str) -> String {
        let named = self
            .header
            .as_ref()
            .and_then(|h| headers.get(h))
            .and_then(|v| v.to_str().ok())
            .unwrap_or(metadata_class);
        self.configured.resolve(named).to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::try_from(*k).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_header_wins_over_metadata_and_unknown_classes_are_other() {
        let classes = ["code".to_string(), "chat".to_string()];
        let rule = RequestClasses::new(&classes, Some("x-workload")).unwrap();
        assert_eq!(rule.resolve(&headers(&[]), "chat"), "chat");
        assert_eq!(
            rule.resolve(&headers(&[("x-workload", "code")]), "chat"),
            "code"
        );
        assert_eq!(
            rule.resolve(&headers(&[("x-workload", "sql")]), "chat"),
            "other"
        );
        assert_eq!(rule.resolve(&headers(&[]), "anything"), "other");
        assert_eq!(rule.resolve(&headers(&[]), ""), "other");
        // Without a configured header, a header is ignored.
        let rule = RequestClasses::new(&classes, None).unwrap();
        assert_eq!(
            rule.resolve(&headers(&[("x-workload", "code")]), ""),
            "other"
        );
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(RequestClasses::new(&["Not Valid".into()], None).is_err());
        assert!(RequestClasses::new(&[], Some("bad header")).is_err());
    }
}
