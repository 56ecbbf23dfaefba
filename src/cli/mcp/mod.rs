//! `memprof mcp`: a Model Context Protocol server on stdin and stdout (the official SDK,
//! `rmcp`), whose tools return the documents the commands print with `--json`, reading only
//! files under the folders given with `--root`.

mod roots;
mod schema;
mod tools;
mod transport;
mod view_state;

use super::Outcome;
use anyhow::Context;
use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use roots::Roots;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use tools::TOOLS;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// A folder whose files the tools may read (repeatable; default: the current folder).
    /// A relative path in a tool call is taken as under the first --root given.
    #[arg(long, value_name = "DIR")]
    pub root: Vec<PathBuf>,
}

/// The server: the roots its tools may read under.
struct Server {
    roots: Arc<Roots>,
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("memprof", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "GPU memory analysis of PyTorch memory snapshots and memprof recordings. Each \
                 tool returns the JSON document of the memprof command of the same name; paths \
                 are files under the server's --root folders.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = TOOLS
            .iter()
            .map(|t| Tool::new(t.name, t.description, t.input_schema()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(index) = TOOLS.iter().position(|t| t.name == request.name) else {
            return Err(ErrorData::invalid_params(
                format!("no tool named {:?}", request.name),
                None,
            ));
        };
        let roots = Arc::clone(&self.roots);
        let arguments = request.arguments.unwrap_or_default();
        // The commands read and compute synchronously: off the thread that serves the protocol.
        // A call that has not answered within the limit is answered with an error, so that a
        // client never waits on it; files are opened without blocking (`source::open`), so
        // none should come near it.
        let call = tokio::task::spawn_blocking(move || TOOLS[index].call(&roots, arguments));
        let outcome = match tokio::time::timeout(CALL_LIMIT, call).await {
            Ok(done) => {
                done.map_err(|e| ErrorData::internal_error(format!("the tool failed: {e}"), None))?
            }
            Err(_) => Err(format!(
                "{}: no answer within {} s; the call was abandoned",
                request.name,
                CALL_LIMIT.as_secs()
            )),
        };
        Ok(match outcome {
            Ok(json) => CallToolResult::success(vec![ContentBlock::text(json)]),
            Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]),
        }
        .into())
    }
}

/// How long one tool call may take before its client is answered with an error.
const CALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

pub fn run(args: &McpArgs) -> anyhow::Result<Outcome> {
    let roots = Arc::new(Roots::new(&args.root)?);
    // Every file a tool opens because an input names it (a recording's libraries, the
    // recording beside a snapshot) must be under the roots too.
    crate::source::open::confine(roots.folders());
    if std::io::stdin().is_terminal() {
        eprintln!(
            "memprof mcp: serving the Model Context Protocol on stdin and stdout; an MCP client \
             starts this command itself (docs/mcp.md); Ctrl-C stops it."
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the MCP server's runtime")?;
    runtime.block_on(async {
        let (stdin, stdout) = rmcp::transport::stdio();
        let service = Server { roots }
            .serve(transport::LineTransport::new(stdin, stdout))
            .await
            .context("MCP handshake")?;
        service.waiting().await.context("MCP server")?;
        anyhow::Ok(())
    })?;
    Ok(Outcome::Ok)
}
