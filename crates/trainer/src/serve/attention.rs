//! `POST /v1/attention`: the attention weights of a prompt, every layer and head or one of
//! each, computed by a worker with the code `tinygpt attention` uses.

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::oneshot;

use super::api::{ApiError, AttentionRequest, AttentionResponse, json, parse};
use super::pool::Job;
use super::state::{Shared, State, body, encode_prompt, submit};
use crate::attention_maps::AttentionMaps;

pub(super) async fn attention(
    Extract(state): Extract<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw, state.options.max_body_bytes)?;
    let request: AttentionRequest = parse(&raw)?;
    let (ids, truncated) = attention_ids(&state, &request)?;
    let config = &state.model.config;
    let (reply, maps) = oneshot::channel();
    submit(
        &state,
        Job::Attention {
            ids: ids.clone(),
            layer: request.layer,
            reply,
        },
    )?;
    let maps = maps
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping"))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let layers: Vec<usize> = (0..config.n_layer)
        .filter(|l| request.layer.is_none_or(|x| x == *l))
        .collect();
    let heads: Vec<usize> = (0..config.n_head)
        .filter(|h| request.head.is_none_or(|x| x == *h))
        .collect();
    let attention = causal_rows(&maps, &layers, &heads);
    let tokens = ids.iter().map(|&id| state.tokenizer().piece(id)).collect();
    let response = AttentionResponse {
        object: "attention",
        model: state.name.clone(),
        tokens,
        token_ids: ids,
        truncated,
        layers,
        heads,
        attention,
    };
    Ok(json(StatusCode::OK, &response))
}

/// Five decimals are plenty for a heatmap and keep the JSON short.
fn round(w: f32) -> f32 {
    (w * 1e5).round() / 1e5
}

/// The prompt's ids (the last block_size of them with `truncate`) and how many were dropped,
/// after checking the layer and head asked for and the size of the answer.
fn attention_ids(state: &State, request: &AttentionRequest) -> Result<(Vec<u32>, usize), ApiError> {
    let config = &state.model.config;
    for (param, value, count) in [
        ("layer", request.layer, config.n_layer),
        ("head", request.head, config.n_head),
    ] {
        if let Some(v) = value.filter(|&v| v >= count) {
            return Err(ApiError::invalid(
                param,
                format!(
                    "{param} {v} does not exist: the model has {count} (0..{})",
                    count - 1
                ),
            ));
        }
    }
    let mut ids = encode_prompt(state.tokenizer(), &request.prompt, "prompt")?;
    let block = state.block_size();
    let truncated = match request.truncate {
        true => ids.len().saturating_sub(block),
        false => 0,
    };
    ids.drain(..truncated);
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if ids.len() > block {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "the prompt is {} tokens but the model's block_size is {block} (send \
                 `truncate: true` to keep the last {block})",
                ids.len()
            ),
        ));
    }
    check_size(state, request.layer, ids.len())?;
    Ok((ids, truncated))
}

/// Refuses a request whose maps would hold more than `--max-attention-weights`, saying how to
/// ask for less: a request for every layer of a long prompt is gigabytes (SmolLM2-135M's 30
/// layers × 9 heads over 2,048 tokens: 1.1G weights, 4.5 GB).
fn check_size(state: &State, layer: Option<usize>, seq: usize) -> Result<(), ApiError> {
    let model = &state.model;
    let cap = state.options.max_attention_weights;
    let layers = model.attention_layers(layer);
    let per_layer = model.config.n_head.saturating_mul(seq).saturating_mul(seq);
    let weights = layers.saturating_mul(per_layer);
    if weights <= cap {
        return Ok(());
    }
    let what = format!(
        "the attention of {layers} layer{} × {} heads over {seq} tokens is {weights} weights, more \
         than this server makes for one request ({cap}, --max-attention-weights)",
        if layers == 1 { "" } else { "s" },
        model.config.n_head,
    );
    if model.attention_layers(Some(0)) < layers && per_layer <= cap {
        return Err(ApiError::invalid(
            "layer",
            format!("{what}: ask for one `layer`"),
        ));
    }
    let longest = (cap / layers.saturating_mul(model.config.n_head)).isqrt();
    Err(ApiError::invalid(
        "prompt",
        format!("{what}: send a prompt of at most {longest} tokens"),
    ))
}

/// `[layer][head][query]`: each query's weights over keys `0..=query`, rounded.
fn causal_rows(maps: &AttentionMaps, layers: &[usize], heads: &[usize]) -> Vec<Vec<Vec<Vec<f32>>>> {
    let seq = maps.labels.len();
    layers
        .iter()
        .map(|&l| {
            heads
                .iter()
                .map(|&h| {
                    let matrix = &maps.maps[l][h];
                    (0..seq)
                        .map(|q| {
                            matrix[q * seq..=q * seq + q]
                                .iter()
                                .map(|&w| round(w))
                                .collect()
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}
