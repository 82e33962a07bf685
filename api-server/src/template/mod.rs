//! Chat templates: the model's Jinja template (GGUF `tokenizer.chat_template` or HF
//! `tokenizer_config.json`) rendered with minijinja the way vLLM renders it through
//! transformers: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, with
//! `trim_blocks` and `lstrip_blocks` on, and the Python string/dict methods templates use
//! (`content.strip()`, `message.get('name')`, ...: Jinja2 inherits them from Python, minijinja
//! has them only through `minijinja_contrib::pycompat`).

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::error::ApiError;

const TEMPLATE_NAME: &str = "chat";

/// One chat message as the template sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TemplateMessage {
    pub role: String,
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: String, eos_token: String) -> Result<Self, ApiError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| ApiError::ModelLoad {
                what: "chat template".into(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders the prompt text for `messages`. A template error (e.g. its `raise_exception` on
    /// a role order it does not support) is the request's fault: a 400.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ApiError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|_| ApiError::Internal)?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| {
                let reason = match e.kind() {
                    ErrorKind::InvalidOperation => {
                        e.detail().unwrap_or("invalid messages").to_owned()
                    }
                    _ => "the chat template cannot render these messages".to_owned(),
                };
                ApiError::invalid("messages", reason)
            })
    }
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> TemplateMessage {
        TemplateMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn raise_exception_is_a_client_error() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
            "<s>".into(),
            "</s>".into(),
        )
        .unwrap();
        assert_eq!(t.render(&[msg("user", "x")], true).unwrap(), "ok");
        let err = t.render(&[msg("assistant", "x")], true).unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert!(err.to_string().contains("first must be user"));
    }

    #[test]
    fn bos_and_generation_prompt_reach_the_template() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}",
            "<s>".into(),
            "</s>".into(),
        )
        .unwrap();
        assert_eq!(
            t.render(&[msg("user", "hi")], true).unwrap(),
            "<s>user:hi\nA:"
        );
        assert_eq!(
            t.render(&[msg("user", "hi")], false).unwrap(),
            "<s>user:hi\n"
        );
    }

    /// The Python methods HF chat templates call, as they reach a template (`m` is the one
    /// message, `{role: "system", content: "  hi  "}`).
    #[test]
    fn python_methods_used_by_chat_templates() {
        let render = |body: &str| {
            let source = ["{% set m = messages[0] %}", body].concat();
            ChatTemplate::new(&source, "<s>".into(), "</s>".into())
                .unwrap()
                .render(&[msg("system", "  hi  ")], false)
                .unwrap()
        };
        assert_eq!(render("[{{ m.content.strip() }}]"), "[hi]");
        assert_eq!(render("[{{ m.content.rstrip() }}]"), "[  hi]");
        assert_eq!(render("{{ m.role.startswith('sys') }}"), "True");
        assert_eq!(render("{{ m.role.upper() }}"), "SYSTEM");
        assert_eq!(render("{{ m.get('name', 'none') }}"), "none");
        assert_eq!(render("{{ m.get('role') }}"), "system");
        assert_eq!(render("{{ 'a,b'.split(',') | length }}"), "2");
        assert_eq!(
            render("{% for k, v in m.items() %}{{ k }}{% endfor %}"),
            "rolecontent"
        );
    }
}
