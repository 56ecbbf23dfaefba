//! The tools `memprof mcp` serves: each is a command's `--json` document, computed by the
//! same function the command prints, from arguments named after its long flags.

use super::roots::Roots;
use super::schema::{command_line, input_schema, Shape};
use super::view_state::{self, ViewStateArgs};
use crate::cli::diagnose::DiagnoseArgs;
use crate::cli::diff::DiffArgs;
use crate::cli::plan::{self, KvArgs, TrainArgs};
use crate::cli::simulate::SimulateArgs;
use crate::cli::{analyze, diagnose, diff, simulate, AnalyzeArgs};
use crate::plan::builtin;
use crate::report::terminal_text::terminal_text;
use anyhow::bail;
use clap::{Args, FromArgMatches};
use serde_json::{Map, Value};

/// How a tool's arguments name files: checked against the roots before the command runs.
#[derive(Clone, Copy)]
enum PathKind {
    /// A file under a root.
    File,
    /// A built-in model name, or a `config.json` (or the folder holding one) under a root.
    Model,
}

/// One tool: its name, what it does, its command's arguments and the document it returns.
pub struct Tool {
    pub name: &'static str,
    pub description: &'static str,
    command: fn(clap::Command) -> clap::Command,
    shape: Shape<'static>,
    paths: &'static [(&'static str, PathKind)],
    run: fn(&clap::ArgMatches) -> anyhow::Result<String>,
}

/// The path of the file a tool reads.
const PATH: (&str, &str, &str) = (
    "file",
    "path",
    "The snapshot pickle or memprof recording: absolute, or relative to the first --root.",
);

/// Parses `matches` as `A` and runs `report`, giving its document as JSON text.
fn document<A: FromArgMatches, T: serde::Serialize>(
    matches: &clap::ArgMatches,
    report: impl FnOnce(&A) -> anyhow::Result<T>,
) -> anyhow::Result<String> {
    let args = A::from_arg_matches(matches)?;
    Ok(serde_json::to_string(&report(&args)?)?)
}

pub const TOOLS: &[Tool] = &[
    Tool {
        name: "analyze",
        description: "Usage, peak, fragmentation, top allocation sites and OOMs of a PyTorch \
                      memory snapshot or memprof recording: the document of `memprof analyze \
                      --json`.",
        command: AnalyzeArgs::augment_args,
        shape: Shape {
            hidden: &["plot"],
            positionals: &[("files", PATH.1, PATH.2)],
        },
        paths: &[("path", PathKind::File)],
        run: |m| document(m, analyze::report),
    },
    Tool {
        name: "diagnose",
        description: "Root cause of an out-of-memory error in a snapshot (with remedies replayed \
                      through the allocator model), a recording, or a log of PyTorch OOM \
                      messages (`log` instead of `path`): the document of `memprof diagnose \
                      --json`.",
        command: DiagnoseArgs::augment_args,
        shape: Shape {
            hidden: &["fail_on_oom"],
            positionals: &[PATH],
        },
        paths: &[("path", PathKind::File), ("log", PathKind::File)],
        run: |m| document(m, |a: &DiagnoseArgs| Ok(diagnose::report(a)?.0)),
    },
    Tool {
        name: "simulate",
        description: "Replay a snapshot's allocation trace through the caching-allocator model \
                      under other settings (`alloc_conf`, PYTORCH_CUDA_ALLOC_CONF syntax), \
                      `sweep` common ones, or `validate` the model against the record: the \
                      document of `memprof simulate --json`.",
        command: SimulateArgs::augment_args,
        shape: Shape {
            hidden: &[],
            positionals: &[(
                PATH.0,
                PATH.1,
                "The PyTorch memory snapshot pickle: absolute, or relative to the first --root.",
            )],
        },
        paths: &[("path", PathKind::File)],
        run: |m| document(m, simulate::report),
    },
    Tool {
        name: "diff",
        description: "What changed at the peak between two runs (snapshots, recordings or \
                      `analyze --json` documents), by site: the document of `memprof diff \
                      --json`.",
        command: DiffArgs::augment_args,
        shape: Shape {
            hidden: &[],
            positionals: &[
                (
                    "before",
                    "before",
                    "The earlier run: absolute, or relative to the first --root.",
                ),
                ("after", "after", "The later run, of the same kind."),
            ],
        },
        paths: &[("before", PathKind::File), ("after", PathKind::File)],
        run: |m| document(m, diff::report),
    },
    Tool {
        name: "plan_train",
        description: "Training memory per GPU for a model and parallelism, searching what is \
                      not fixed: the document of `memprof plan train --json`.",
        command: TrainArgs::augment_args,
        shape: Shape {
            hidden: &["plot", "explain"],
            positionals: &[],
        },
        paths: &[
            ("model", PathKind::Model),
            ("calibrate", PathKind::File),
            ("calibrate_model", PathKind::Model),
        ],
        run: |m| plan::train_json(&TrainArgs::from_arg_matches(m)?),
    },
    Tool {
        name: "plan_kv",
        description: "KV-cache pool sizing for serving, and a simulated request `workload`: the \
                      document of `memprof plan kv --json`.",
        command: KvArgs::augment_args,
        shape: Shape {
            hidden: &[],
            positionals: &[],
        },
        paths: &[("model", PathKind::Model), ("workload", PathKind::File)],
        run: |m| plan::kv_json(&KvArgs::from_arg_matches(m)?),
    },
    Tool {
        name: "view_state",
        description: "The memory state just after one trace entry (the peak by default), as \
                      `memprof view` shows it at its cursor: totals, segments, the largest \
                      free blocks and allocations, and the sites holding the live bytes.",
        command: ViewStateArgs::augment_args,
        shape: Shape {
            hidden: &[],
            positionals: &[PATH],
        },
        paths: &[("path", PathKind::File)],
        run: |m| document(m, view_state::report),
    },
];

impl Tool {
    fn clap(&self) -> clap::Command {
        (self.command)(clap::Command::new(self.name))
    }

    /// The JSON schema of the tool's arguments.
    pub fn input_schema(&self) -> Map<String, Value> {
        input_schema(&self.clap(), &self.shape)
    }

    /// Runs the tool: its JSON document, or the one-line message the command would print.
    pub fn call(&self, roots: &Roots, arguments: Map<String, Value>) -> Result<String, String> {
        let one_line = |e: anyhow::Error| terminal_text(&format!("{e:#}")).to_string();
        let arguments = self.confine(roots, arguments).map_err(one_line)?;
        let command = self.clap();
        let argv = command_line(&command, &self.shape, &arguments)?;
        let matches = command.try_get_matches_from(argv).map_err(|e| {
            // clap's first paragraph, on one line: what is wrong, without the usage and tips.
            let text = e.to_string();
            let first = text.split("\n\n").next().unwrap_or("");
            let words: Vec<&str> = first.split_whitespace().collect();
            let line = words.join(" ");
            terminal_text(line.strip_prefix("error: ").unwrap_or(&line)).to_string()
        })?;
        (self.run)(&matches).map_err(one_line)
    }

    /// The arguments with each file replaced by its canonical path under a root.
    fn confine(
        &self,
        roots: &Roots,
        mut arguments: Map<String, Value>,
    ) -> anyhow::Result<Map<String, Value>> {
        for (name, kind) in self.paths {
            let given = match arguments.get(*name) {
                None | Some(Value::Null) => continue,
                Some(Value::String(given)) => given,
                // A number would reach the command as a path taken from the server's working
                // folder, unchecked against the roots.
                Some(other) => bail!("{name}: expected a path (a string), got {other}"),
            };
            let file = match kind {
                PathKind::Model if builtin::find(given).is_some() => continue,
                PathKind::Model => roots
                    .file(given)
                    .or_else(|e| {
                        roots
                            .file(&format!("{}/config.json", given.trim_end_matches('/')))
                            .map_err(|_| e)
                    })
                    .map_err(|e| {
                        // A name with a typo: say which names there are, as `plan` does.
                        anyhow::anyhow!(
                            "{e:#}; nor is it a built-in model ({})",
                            builtin::NAMES.join(", ")
                        )
                    })?,
                PathKind::File => roots.file(given)?,
            };
            arguments.insert(name.to_string(), Value::String(file.display().to_string()));
        }
        Ok(arguments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_flags_positionals_and_paths_name_real_arguments() {
        for tool in TOOLS {
            let command = tool.clap();
            let ids: Vec<&str> = command
                .get_arguments()
                .map(|a| a.get_id().as_str())
                .collect();
            for id in tool
                .shape
                .hidden
                .iter()
                .chain(tool.shape.positionals.iter().map(|p| &p.0))
            {
                assert!(ids.contains(id), "{}: no argument {id}", tool.name);
            }
            let schema = tool.input_schema();
            let properties = schema["properties"].as_object().expect("properties");
            for (name, _) in tool.paths {
                assert!(
                    properties.contains_key(*name),
                    "{}: no property {name}",
                    tool.name
                );
            }
            for hidden in tool.shape.hidden {
                assert!(
                    !properties.contains_key(*hidden),
                    "{}: {hidden} shown",
                    tool.name
                );
            }
            // Every file argument a tool shows is confined to the roots.
            for argument in command.get_arguments() {
                let id = argument.get_id().as_str();
                // A positional is given by the property the shape names for it.
                let property = tool
                    .shape
                    .positionals
                    .iter()
                    .find(|p| p.0 == id)
                    .map_or(id, |p| p.1);
                let is_path = argument.get_value_parser().type_id()
                    == clap::builder::ValueParser::path_buf().type_id();
                assert!(
                    !is_path
                        || tool.shape.hidden.contains(&id)
                        || tool.paths.iter().any(|(name, _)| *name == property),
                    "{}: the file argument {id} is not confined to the roots",
                    tool.name
                );
            }
        }
    }

    #[test]
    fn a_path_given_as_a_number_is_refused_not_read_from_the_working_folder() {
        let root = tempfile::tempdir().expect("a scratch folder");
        let roots = Roots::new(&[root.path().to_path_buf()]).expect("roots");
        let tool = TOOLS.iter().find(|t| t.name == "diff").expect("diff");
        let arguments = serde_json::json!({"before": 1, "after": 2});
        let refused = tool
            .call(&roots, arguments.as_object().expect("an object").clone())
            .expect_err("refused");
        assert_eq!(refused, "before: expected a path (a string), got 1");
    }

    #[test]
    fn a_model_that_is_neither_a_file_nor_built_in_lists_the_built_in_names() {
        let root = tempfile::tempdir().expect("a scratch folder");
        let roots = Roots::new(&[root.path().to_path_buf()]).expect("roots");
        let tool = TOOLS.iter().find(|t| t.name == "plan_kv").expect("plan_kv");
        let arguments = serde_json::json!({"model": "llama-3-9b", "gpu_memory": "80GiB"});
        let refused = tool
            .call(&roots, arguments.as_object().expect("an object").clone())
            .expect_err("refused");
        assert!(
            refused.starts_with("llama-3-9b: cannot open: ")
                && refused.contains("nor is it a built-in model (")
                && refused.contains("llama-3-8b"),
            "{refused}"
        );
    }

    #[test]
    fn booleans_are_bare_flags_and_values_follow_an_equals_sign() {
        let tool = TOOLS
            .iter()
            .find(|t| t.name == "simulate")
            .expect("simulate");
        let arguments = serde_json::json!({
            "path": "-odd.pickle", "alloc_conf": "expandable_segments:True", "sweep": true,
            "validate": false,
        });
        let argv = command_line(
            &tool.clap(),
            &tool.shape,
            arguments.as_object().expect("an object"),
        )
        .expect("a command line");
        assert_eq!(
            argv,
            [
                "simulate",
                "--json",
                "--alloc-conf=expandable_segments:True",
                "--sweep",
                "--",
                "-odd.pickle"
            ]
        );
    }
}
