//! The Python `str` and `dict` methods HF chat templates call (`content.strip()`,
//! `message.get('name')`, `role.startswith('sys')`, ...), which Jinja2 inherits from Python and
//! minijinja does not have. Plugged in as minijinja's unknown-method callback.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

fn unknown() -> Error {
    Error::from(ErrorKind::UnknownMethod)
}

fn str_arg(args: &[Value], i: usize) -> Result<Option<String>, Error> {
    match args.get(i) {
        None => Ok(None),
        Some(v) if v.is_none() || v.is_undefined() => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "expected a string argument")),
    }
}

fn string_method(s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    let chars = str_arg(args, 0)?;
    let trim_set = |c: char| match &chars {
        Some(set) => set.contains(c),
        None => c.is_whitespace(),
    };
    Ok(match method {
        "strip" => Value::from(s.trim_matches(trim_set)),
        "lstrip" => Value::from(s.trim_start_matches(trim_set)),
        "rstrip" => Value::from(s.trim_end_matches(trim_set)),
        "upper" => Value::from(s.to_uppercase()),
        "lower" => Value::from(s.to_lowercase()),
        "startswith" => Value::from(s.starts_with(chars.as_deref().ok_or_else(unknown)?)),
        "endswith" => Value::from(s.ends_with(chars.as_deref().ok_or_else(unknown)?)),
        "replace" => {
            let to = str_arg(args, 1)?.ok_or_else(unknown)?;
            Value::from(s.replace(chars.as_deref().ok_or_else(unknown)?, &to))
        }
        "split" => match chars {
            Some(sep) if !sep.is_empty() => {
                Value::from(s.split(sep.as_str()).map(Value::from).collect::<Vec<_>>())
            }
            _ => Value::from(s.split_whitespace().map(Value::from).collect::<Vec<_>>()),
        },
        _ => return Err(unknown()),
    })
}

fn map_method(state: &State, map: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    match method {
        "items" => state.apply_filter("items", std::slice::from_ref(map)),
        "keys" => Ok(Value::from(map.try_iter()?.collect::<Vec<_>>())),
        "values" => {
            let keys: Vec<Value> = map.try_iter()?.collect();
            let values = keys
                .iter()
                .map(|k| map.get_item(k))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::from(values))
        }
        "get" => {
            let key = args.first().ok_or_else(unknown)?;
            let found = map.get_item(key)?;
            if found.is_undefined() {
                Ok(args.get(1).cloned().unwrap_or(Value::from(())))
            } else {
                Ok(found)
            }
        }
        _ => Err(unknown()),
    }
}

/// minijinja's unknown-method callback.
pub fn method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    match value.kind() {
        ValueKind::String => string_method(value.as_str().unwrap_or(""), method, args),
        ValueKind::Map => map_method(state, value, method, args),
        _ => Err(unknown()),
    }
}

#[cfg(test)]
mod tests {
    use minijinja::{context, Environment};

    fn render(source: &str) -> String {
        let mut env = Environment::new();
        env.set_unknown_method_callback(super::method);
        env.render_str(
            source,
            context! { m => context! { role => "system", content => "  hi  " } },
        )
        .unwrap()
    }

    #[test]
    fn python_methods_used_by_chat_templates() {
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
