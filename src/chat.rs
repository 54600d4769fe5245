//! The model's chat template (from its metadata), rendered with minijinja.

use minijinja::{Environment, Error as JinjaError, ErrorKind, context};
use serde::Deserialize;

/// One chat message.
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    #[serde(default)]
    pub content: String,
}

/// Errors from a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The model's template is not valid Jinja (or uses what minijinja lacks): the
    /// model's metadata is at fault.
    #[error("the model's chat template does not compile: {0}")]
    Compile(#[source] JinjaError),
    /// The template refused these messages (`raise_exception`, for example roles out of
    /// the order it expects): the request is at fault.
    #[error("the model's chat template refused these messages: {0}")]
    Render(#[source] JinjaError),
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

fn raise_exception(msg: String) -> Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compile `source` (a Hugging Face Jinja chat template).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string())
            .map_err(TemplateError::Compile)?;
        Ok(Self {
            env,
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// The prompt text for `messages`, ending where the assistant's answer begins.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        let t = self
            .env
            .get_template("chat")
            .map_err(TemplateError::Compile)?;
        t.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(TemplateError::Render)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_a_generation_prompt() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t
            .render(&[ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }])
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let bad = ChatTemplate::new("{{ raise_exception('no') }}", "", "").unwrap();
        let refused = bad.render(&[]).unwrap_err();
        assert!(
            matches!(refused, TemplateError::Render(_)) && refused.to_string().contains("no"),
            "{refused}"
        );
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(TemplateError::Compile(_))
        ));
    }
}
