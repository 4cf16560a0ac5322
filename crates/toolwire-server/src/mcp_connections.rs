//! The live connections of the MCP servers added through the API, by
//! record id: made on first use, kept while the server runs, forgotten
//! (and stopped) when the record changes. Holds connections only; what a
//! record says is `agents::mcp`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use toolwire_tools::mcp::McpServer;

#[derive(Default)]
pub struct McpConnections {
    servers: Mutex<HashMap<String, Arc<McpServer>>>,
}

impl McpConnections {
    /// The connection of `id`, made by `make` if there is none.
    pub fn handle(&self, id: &str, make: impl FnOnce() -> Arc<McpServer>) -> Arc<McpServer> {
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        servers.entry(id.to_owned()).or_insert_with(make).clone()
    }

    /// Forgets the connection of `id` (stopping it), so that the next use
    /// starts the server as its record now says.
    pub async fn forget(&self, id: &str) {
        let gone = self
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        if let Some(server) = gone {
            server.shutdown().await;
        }
    }
}
