//! [`ServeOptions`]: how the server listens and what it allows, checked before it starts.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};

use super::connections::ConnectionLimits;
use crate::chat::ChatTemplate;

/// How the server listens and what it allows.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen; port 0 picks a free one (printed at start).
    pub addr: SocketAddr,
    /// Required as `Authorization: Bearer KEY` on every `/v1` route when set. A server that
    /// listens beyond the loopback interface must have one.
    pub api_key: Option<String>,
    /// Worker threads (each with its own KV caches).
    pub max_concurrent: usize,
    /// Requests each worker decodes at once in one batch.
    pub max_batch: usize,
    /// Requests that may wait for a worker; beyond that, 429.
    pub queue: usize,
    /// The largest `max_tokens` a request may ask for.
    pub max_tokens: usize,
    /// The longest prompt, in tokens (`None`: the model's block_size).
    pub max_prompt_tokens: Option<usize>,
    /// The largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// The most attention weights one `/v1/attention` request may make (layers × heads ×
    /// tokens², 4 bytes each while answering; 400 beyond).
    pub max_attention_weights: usize,
    /// The context shift for requests that do not say (see [`tinygpt_model::GenerateOptions`]).
    pub context_shift: bool,
    /// How `/v1/chat/completions` writes a conversation as a prompt.
    pub chat_template: ChatTemplate,
    /// After Ctrl-C or SIGTERM, how long requests in flight may take before their connections
    /// are closed.
    pub shutdown_timeout: Duration,
    /// What one client may hold, and for how long.
    pub connections: ConnectionLimits,
}

impl ServeOptions {
    /// Refuses settings that cannot work, naming the flag.
    pub fn validate(&self) -> Result<()> {
        if !self.addr.ip().is_loopback() && self.api_key.is_none() {
            bail!(
                "--host {} makes the model reachable from the network: pass --api-key KEY too \
                 (clients then send `Authorization: Bearer KEY`)",
                self.addr.ip()
            );
        }
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            bail!("--api-key is empty");
        }
        for (flag, value) in [
            ("--max-concurrent", self.max_concurrent),
            ("--max-batch", self.max_batch),
            ("--max-tokens", self.max_tokens),
            ("--max-prompt-tokens", self.max_prompt_tokens.unwrap_or(1)),
            ("--max-body-bytes", self.max_body_bytes),
            ("--max-attention-weights", self.max_attention_weights),
            ("--max-connections", self.connections.max_connections),
        ] {
            if value == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        let limits = &self.connections;
        for (flag, value) in [
            ("--header-timeout", limits.header_timeout),
            ("--body-timeout", limits.body_timeout),
            ("--write-timeout", limits.write_timeout),
        ] {
            if value.is_zero() {
                bail!("{flag} must be longer than 0s");
            }
        }
        if u32::try_from(limits.max_connections).is_err() {
            bail!("--max-connections must be at most {}", u32::MAX);
        }
        Ok(())
    }
}
