// The engine as its clients (the server, the CLI tools, the load generator's in-process runs) see
// it, in one header: Engine (Submit, Cancel, stats, config), the request it takes
// (GenerationRequest: prompt, max_tokens, SamplingParams, stops, grammar, retention, pooling) and
// the stream it gives back (RequestStream, StreamUpdate: tokens, text, TokenLogprobs,
// PromptLogprobs, FinishReason). Clients include this header, never the scheduler's, the
// runner's or the KV manager's, whose value types it carries.
#pragma once

#include "engine/engine.h"
#include "engine/request_queue.h"
