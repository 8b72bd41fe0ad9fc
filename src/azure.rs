//! Azure OpenAI's paths: which client paths are Azure's, where on the one configured
//! upstream each goes, and the [`Deployment`] a classic path names.
//!
//! Azure is configured by its v1 base, as Azure documents it for the standard OpenAI
//! clients: `upstream = "https://RESOURCE.openai.azure.com/openai/v1"` (a gateway in
//! front of Azure may put a prefix before `/openai/v1`). Then:
//!
//! - `/openai/v1/<rest>` is the same as `/v1/<rest>`: `<base><rest>`, whatever the
//!   upstream (it is only another spelling of the v1 base);
//! - every other `/openai/<rest>` — the classic API, `/openai/deployments/{deployment}/…
//!   ?api-version=…` and the rest of it — keeps its path: it goes to
//!   `<prefix>/openai/<rest>`, where the base is `<prefix>/openai/v1`. With an upstream
//!   that is not such a base, those paths are unknown (404), since no other provider
//!   serves them.
//!
//! Scheme, host and port are the configured upstream's, always; the query
//! (`api-version`) is passed on as it came.

/// The prefix of every API path a client sends (`/v1/chat/completions`).
pub const API_PREFIX: &str = "/v1";
/// The v1 base under Azure's `/openai` root.
const V1: &str = "/openai/v1";
/// Azure's classic API root.
const ROOT: &str = "/openai";
/// The classic deployment paths, below [`ROOT`].
const DEPLOYMENTS: &str = "/deployments/";

/// Where a client path goes, as the part appended to a base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapped<'p> {
    /// `/v1<rest>` or `/openai/v1<rest>`: `rest` is appended to the upstream base.
    Base(&'p str),
    /// `/openai<rest>` (not the v1 base): Azure's classic API; `rest` is appended to the
    /// upstream's classic root (see [`classic_root`]).
    Classic(&'p str),
    /// Neither: not a path abridge serves.
    Unknown,
}

/// The mapping of a client path (see the module docs).
pub fn map(path: &str) -> Mapped<'_> {
    if let Some(rest) = below(path, API_PREFIX) {
        return Mapped::Base(rest);
    }
    if let Some(rest) = below(path, V1) {
        return Mapped::Base(rest);
    }
    match below(path, ROOT) {
        Some(rest) if !rest.is_empty() => Mapped::Classic(rest),
        _ => Mapped::Unknown,
    }
}

/// `path` below `prefix` (`""` or starting with `/`), when it is below it.
fn below<'p>(path: &'p str, prefix: &str) -> Option<&'p str> {
    path.strip_prefix(prefix)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The classic root of an upstream base path: `<prefix>/openai` when the base is
/// `<prefix>/openai/v1`, else `None` (the upstream is not Azure's v1 base).
pub fn classic_root(base_path: &str) -> Option<&str> {
    base_path
        .strip_suffix(V1)
        .map(|prefix| &base_path[..prefix.len() + ROOT.len()])
}

/// The deployment a classic path names, and the `api-version` its query carried: the
/// deployment stands in for the model (Azure's bodies usually name none), and a summary
/// for the conversation is asked of the same deployment with the same `api-version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// The path segment, as sent (Azure's deployment names need no escaping).
    pub name: String,
    /// The `api-version` query value, as sent (still percent-encoded).
    pub api_version: Option<String>,
}

impl Deployment {
    /// The deployment of `/openai/deployments/{name}/…` (with the `api-version` of
    /// `query`); `None` for any other path.
    pub fn of(path: &str, query: Option<&str>) -> Option<Self> {
        let Mapped::Classic(rest) = map(path) else {
            return None;
        };
        let name = rest.strip_prefix(DEPLOYMENTS)?.split('/').next()?;
        if name.is_empty() {
            return None;
        }
        let api_version = query.and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("api-version="))
                .map(str::to_owned)
        });
        Some(Self {
            name: name.to_owned(),
            api_version,
        })
    }

    /// The path and query, below the classic root, of `<operation>` (e.g.
    /// `/chat/completions`) on `deployment` with this request's `api-version`.
    pub fn path_for(&self, deployment: &str, operation: &str) -> String {
        let mut path = format!("{DEPLOYMENTS}{deployment}{operation}");
        if let Some(version) = &self.api_version {
            path.push_str("?api-version=");
            path.push_str(version);
        }
        path
    }
}

/// The model a request is for: the one its body names, or — when it names none, as
/// Azure's classic bodies usually do — its deployment's name.
pub fn model_of<'a>(named: &'a str, deployment: Option<&'a Deployment>) -> &'a str {
    match deployment {
        Some(d) if named.is_empty() => &d.name,
        _ => named,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_v1_the_v1_base_and_the_classic_paths() {
        assert_eq!(
            map("/v1/chat/completions"),
            Mapped::Base("/chat/completions")
        );
        assert_eq!(map("/v1"), Mapped::Base(""));
        assert_eq!(map("/openai/v1/responses"), Mapped::Base("/responses"));
        assert_eq!(
            map("/openai/deployments/gpt-4o/chat/completions"),
            Mapped::Classic("/deployments/gpt-4o/chat/completions")
        );
        assert_eq!(map("/openai/models"), Mapped::Classic("/models"));
        assert_eq!(map("/openai/v1x"), Mapped::Classic("/v1x"));
        for unknown in ["/openai", "/openai/", "/openaix/v1", "/v2/x", "/", "/admin"] {
            let expected = if unknown == "/openai/" {
                Mapped::Classic("/")
            } else {
                Mapped::Unknown
            };
            assert_eq!(map(unknown), expected, "{unknown}");
        }
    }

    #[test]
    fn the_deployment_stands_in_for_a_model_the_body_does_not_name() {
        let d = Deployment::of("/openai/deployments/gpt-4o-prod/chat/completions", None);
        assert_eq!(model_of("", d.as_ref()), "gpt-4o-prod");
        assert_eq!(model_of("gpt-4o", d.as_ref()), "gpt-4o");
        assert_eq!(model_of("", None), "");
    }

    #[test]
    fn the_classic_root_is_the_parent_of_an_azure_v1_base() {
        assert_eq!(classic_root("/openai/v1"), Some("/openai"));
        assert_eq!(classic_root("/team/openai/v1"), Some("/team/openai"));
        assert_eq!(classic_root("/v1"), None);
        assert_eq!(classic_root("/api/v1"), None);
        assert_eq!(classic_root(""), None);
    }

    #[test]
    fn a_deployment_and_its_api_version_come_from_the_path_and_query() {
        let d = Deployment::of(
            "/openai/deployments/prod-gpt4o/chat/completions",
            Some("x=1&api-version=2024-10-21"),
        )
        .unwrap();
        assert_eq!(d.name, "prod-gpt4o");
        assert_eq!(d.api_version.as_deref(), Some("2024-10-21"));
        assert_eq!(
            d.path_for("cheap", "/chat/completions"),
            "/deployments/cheap/chat/completions?api-version=2024-10-21"
        );
        let bare = Deployment::of("/openai/deployments/d/embeddings", None).unwrap();
        assert_eq!(bare.api_version, None);
        assert_eq!(bare.path_for("d", "/x"), "/deployments/d/x");
        for none in [
            "/openai/deployments/",
            "/openai/deployments//chat/completions",
            "/openai/v1/chat/completions",
            "/v1/deployments/d/chat/completions",
            "/openai/models",
        ] {
            assert_eq!(Deployment::of(none, None), None, "{none}");
        }
    }
}
