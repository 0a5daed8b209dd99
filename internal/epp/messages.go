package epp

// The Messages API (POST /v1/messages) is routed as chat is; what differs
// is how its response is read (Anthropic's events and usage) and the shape
// of the picker's own refusals on its path (immediate).

// isMessages reports whether path is the Messages API's.
func isMessages(path string) bool { return path == "/v1/messages" }

// messagesEvent reads one Messages API event: a content_block_delta with a
// delta carries output; message_start's message has the input (and cached)
// tokens, message_delta's usage the cumulative output tokens, each keeping
// what the other said.
func (w *watcher) messagesEvent(c *chunkJSON) {
	switch c.Type {
	case "content_block_delta":
		if nonEmpty(c.Delta) {
			w.tokens++
		}
	case "message_start":
		if c.Message != nil && c.Message.Usage != nil {
			w.mergeMessagesUsage(c.Message.Usage)
		}
	case "message_delta":
		if c.Usage != nil {
			w.mergeMessagesUsage(c.Usage)
		}
	}
}

// setMessagesUsage reads a whole message's usage.
func (w *watcher) setMessagesUsage(u *usageJSON) {
	w.prompt, w.cached, w.completion = -1, -1, -1
	w.mergeMessagesUsage(u)
}

// mergeMessagesUsage reads a Messages API usage over what was known: the
// prompt is input_tokens with the cache's reads and writes added, as
// Anthropic counts them; the cached tokens are cache_read_input_tokens
// (unknown when the backend does not say, as vLLM does not).
func (w *watcher) mergeMessagesUsage(u *usageJSON) {
	w.sawUsage = true
	if u.InputTokens != nil {
		w.prompt = *u.InputTokens
		for _, v := range []*int{u.CacheReadInputTokens, u.CacheCreationInputTokens} {
			if v != nil {
				w.prompt += *v
			}
		}
	}
	if u.CacheReadInputTokens != nil {
		w.cached = *u.CacheReadInputTokens
	}
	if u.OutputTokens != nil {
		w.completion = *u.OutputTokens
	}
}
