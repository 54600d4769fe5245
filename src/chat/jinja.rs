//! What transformers adds to Jinja for chat templates, so that a template renders here as
//! `apply_chat_template` renders it: its whitespace settings (`trim_blocks`,
//! `lstrip_blocks`), Python's string and dict methods (`.startswith`,
//! `.split`, `.items()`; minijinja-contrib's), loop controls, `raise_exception`,
//! `strftime_now`, a `tojson` that writes what Python's `json.dumps` writes, and the
//! `generation` tag.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

/// An environment with transformers' additions.
pub(super) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    // transformers compiles templates with both: a block tag's line leaves no newline
    // and no indentation behind (templates written without `-` rely on it).
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}

fn raise_exception(msg: String) -> Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`: `json.dumps` with those arguments. Tool schemas reach the model
/// through it (Qwen's, Llama 3's and SmolLM3's templates), so its spacing is what the
/// model was trained on: `{"a": 1, "b": [1, 2]}`, not the compact form.
fn tojson(value: Value, kwargs: Kwargs) -> Result<String, JinjaError> {
    let bad = |what: &str| JinjaError::new(ErrorKind::InvalidOperation, what.to_string());
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            None => Some(
                v.as_str()
                    .ok_or_else(|| bad("tojson: indent is a number or a string"))?
                    .to_string(),
            ),
        },
    };
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(bad("tojson: separators is a pair of strings")),
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let json = serde_json::to_value(&value).map_err(|e| bad(&format!("tojson: {e}")))?;
    let dumps = PythonJson {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    dumps.write(&json, 0, &mut out);
    Ok(out)
}

/// `json.dumps`' layout of a value.
struct PythonJson {
    ensure_ascii: bool,
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl PythonJson {
    fn write(&self, v: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::String(s) => self.string(s, out),
            J::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.between(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            J::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.between(i, depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
            // Numbers, booleans, null and empty containers as serde_json writes them.
            other => out.push_str(&other.to_string()),
        }
    }

    /// Before the `i`-th element of a container: the item separator after the first,
    /// and with an indent a new line.
    fn between(&self, i: usize, depth: usize, out: &mut String) {
        if i > 0 {
            out.push_str(&self.item);
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    fn close(&self, depth: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        let quoted = serde_json::Value::String(s.to_string()).to_string();
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
}

/// transformers' `strftime_now(format)`: the time now as Python's `strftime` formats it
/// (in UTC; transformers takes the host's zone). Templates print today's date with it:
/// SmolLM3's always, Llama 3's where it is defined (else a fixed date).
fn strftime_now(format: String) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(&format, now)
}

/// `format` as C's `strftime` formats the UTC time `unix_seconds`, for the directives
/// templates use (%Y %y %m %d %e %B %b %A %a %H %I %p %M %S %j %%); any other is kept as
/// written, as glibc keeps an unknown one.
fn strftime(format: &str, unix_seconds: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let (days, secs) = (
        unix_seconds.div_euclid(86_400),
        unix_seconds.rem_euclid(86_400),
    );
    // Howard Hinnant's days-to-civil: years of March to February, eras of 400 years.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_march = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_march + 2) / 153;
    let day = doy_march - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before_month = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][month as usize - 1];
    let yday = before_month + day + i64::from(leap && month > 2);
    let (hour, minute, second) = (secs / 3_600, secs / 60 % 60, secs % 60);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[month as usize - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &format!("{:02}", year.rem_euclid(100)),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('e') => out += &format!("{day:>2}"),
            Some('B') => out += month_name,
            Some('b') => out += &month_name[..3],
            Some('A') => out += weekday,
            Some('a') => out += &weekday[..3],
            Some('H') => out += &format!("{hour:02}"),
            Some('I') => out += &format!("{:02}", (hour + 11) % 12 + 1),
            Some('p') => out += if hour < 12 { "AM" } else { "PM" },
            Some('M') => out += &format!("{minute:02}"),
            Some('S') => out += &format!("{second:02}"),
            Some('j') => out += &format!("{yday:03}"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `source` with transformers' `{% generation %}` … `{% endgeneration %}` tags (which mark
/// the assistant's tokens for training masks and render their body unchanged; SmolLM3's
/// template has them) as `{% if true %}` … `{% endif %}`, keeping their whitespace control.
pub(super) fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let Some(len) = rest[open..].find("%}") else {
            break;
        };
        let tag = &rest[open..open + len + 2];
        let inner = tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+');
        let keyword = match inner.trim() {
            "generation" => Some(("generation", "if true")),
            "endgeneration" => Some(("endgeneration", "endif")),
            _ => None,
        };
        out += &rest[..open];
        match keyword {
            Some((word, with)) => out += &tag.replacen(word, with, 1),
            None => out += tag,
        }
        rest = &rest[open + len + 2..];
    }
    out + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: Value) -> String {
        let mut env = environment();
        env.add_template_owned("t", without_generation_tags(src))
            .unwrap();
        env.get_template("t").unwrap().render(ctx).unwrap()
    }

    #[test]
    fn tojson_writes_what_python_s_json_dumps_writes() {
        let tool = serde_json::json!({"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "description": "Zürich <or> \"Bern\""}},
            "required": ["city"], "n": 1.5, "none": null, "empty": {}, "list": []}});
        let ctx = Value::from_serialize(serde_json::json!({"tool": tool}));
        // Printed by Python 3.11: json.dumps(tool), and with indent=2, sort_keys=True,
        // separators=(",", ":"), ensure_ascii=True.
        assert_eq!(
            render("{{ tool | tojson }}", ctx.clone()),
            r#"{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Zürich <or> \"Bern\""}}, "required": ["city"], "n": 1.5, "none": null, "empty": {}, "list": []}}"#
        );
        assert_eq!(
            render(
                "{{ tool.parameters.required | tojson(indent=2) }}",
                ctx.clone()
            ),
            "[\n  \"city\"\n]"
        );
        assert_eq!(
            render(
                "{{ tool | tojson(sort_keys=true, separators=(',', ':'), ensure_ascii=true) }}",
                ctx
            ),
            r#"{"name":"get_weather","parameters":{"empty":{},"list":[],"n":1.5,"none":null,"properties":{"city":{"description":"Z\u00fcrich <or> \"Bern\"","type":"string"}},"required":["city"],"type":"object"}}"#
        );
    }

    #[test]
    fn maps_keep_their_order_and_loops_can_break() {
        let ctx = Value::from_serialize(serde_json::json!({"p": {"z": 1, "a": 2, "m": 3}}));
        let src =
            "{% for k, v in p|items %}{% if v == 3 %}{% break %}{% endif %}{{ k }}{% endfor %}";
        assert_eq!(render(src, ctx), "za");
    }

    #[test]
    fn strftime_formats_dates_as_c_does() {
        // 2023-11-14 22:13:20 UTC, a Tuesday, day 318.
        let t = 1_700_000_000;
        assert_eq!(strftime("%d %B %Y", t), "14 November 2023");
        assert_eq!(
            strftime("%a %b %e %H:%M:%S %y", t),
            "Tue Nov 14 22:13:20 23"
        );
        assert_eq!(
            strftime("%A %j %I%p %m %% %Q", t),
            "Tuesday 318 10PM 11 % %Q"
        );
        assert_eq!(strftime("%Y-%m-%d %A", 0), "1970-01-01 Thursday");
        // A leap day, the day after, and a date before 1970.
        assert_eq!(
            strftime("%Y-%m-%d %j %a", 951_782_400),
            "2000-02-29 060 Tue"
        );
        assert_eq!(strftime("%Y-%m-%d %j", 951_868_800), "2000-03-01 061");
        assert_eq!(strftime("%Y-%m-%d %H %A", -1), "1969-12-31 23 Wednesday");
        assert_eq!(strftime("%Y-%m-%d %j", 1_735_603_200), "2024-12-31 366");
    }

    #[test]
    fn templates_can_print_today_as_transformers_lets_them() {
        // SmolLM3's template calls it unguarded; Llama 3's asks whether it is defined.
        let src = "{% if strftime_now is defined %}{{ strftime_now('%d %B %Y') }}{% endif %}";
        let before = strftime_now("%d %B %Y".into());
        let out = render(src, Value::UNDEFINED);
        assert!(
            out == before || out == strftime_now("%d %B %Y".into()),
            "{out}"
        );
        assert!(out.len() >= "01 May 2026".len(), "{out}");
    }

    #[test]
    fn generation_tags_become_blocks_that_render_their_body() {
        assert_eq!(
            without_generation_tags("a{%- generation -%}b{% endgeneration %}{% if x %}"),
            "a{%- if true -%}b{% endif %}{% if x %}"
        );
    }
}
