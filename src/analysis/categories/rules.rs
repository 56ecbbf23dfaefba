//! The user's own categories: `--category NAME=REGEX`, matched against the frames of a
//! filtered stack (and PyTorch's `user_metadata`); the first rule that matches wins.

use regex::Regex;

/// One `NAME=REGEX` rule.
#[derive(Clone, Debug)]
pub struct CategoryRule {
    pub name: String,
    pub pattern: Regex,
}

/// The rules in the order given.
#[derive(Clone, Debug, Default)]
pub struct CategoryRules(Vec<CategoryRule>);

impl CategoryRules {
    /// Parses `NAME=REGEX` arguments; the message names the one that is wrong.
    pub fn parse(given: &[String]) -> Result<CategoryRules, String> {
        given
            .iter()
            .map(|g| {
                let (name, pattern) = g
                    .split_once('=')
                    .ok_or_else(|| format!("--category {g:?}: expected NAME=REGEX"))?;
                let valid = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    return Err(format!(
                        "--category {g:?}: NAME must be letters, digits, '_' or '-'"
                    ));
                }
                let pattern = Regex::new(pattern)
                    .map_err(|e| format!("--category {g:?}: not a regular expression ({e})"))?;
                Ok(CategoryRule {
                    name: name.to_string(),
                    pattern,
                })
            })
            .collect::<Result<_, _>>()
            .map(CategoryRules)
    }

    pub fn rules(&self) -> &[CategoryRule] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first rule whose pattern matches one of `texts`.
    pub fn matching<'t>(&self, texts: impl IntoIterator<Item = &'t str> + Clone) -> Option<usize> {
        self.0
            .iter()
            .position(|r| texts.clone().into_iter().any(|t| r.pattern.is_match(t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_matching_rule_wins_and_bad_rules_are_named() {
        let rules = CategoryRules::parse(&[
            "kv_cache=kv_cache\\.py".to_string(),
            "attention=attn|kv".to_string(),
        ])
        .expect("valid");
        assert_eq!(rules.matching(["/w/kv_cache.py:3:grow"]), Some(0));
        assert_eq!(rules.matching(["/w/model.py:9:attn"]), Some(1));
        assert_eq!(rules.matching(["/w/model.py:9:mlp"]), None);
        let bad = CategoryRules::parse(&["x=(".to_string()]).expect_err("not a pattern");
        assert!(bad.contains("not a regular expression"), "{bad}");
        assert!(CategoryRules::parse(&["novalue".to_string()]).is_err());
        assert!(CategoryRules::parse(&["a b=x".to_string()]).is_err());
    }
}
