package tokenizer

// Message is one chat message as the OpenAI chat API carries it.
type Message struct {
	// Role is who wrote the message: "system", "user", "assistant" or any
	// other name; it is encoded as text, not interpreted.
	Role string
	// Content is the message text.
	Content string
}

// headerSep is what the Llama-3 template puts between a role header and the
// content.
const headerSep = "\n\n"

// assistantRole is the role of the reply that a generation prompt invites.
const assistantRole = "assistant"

// EncodeChat renders msgs with the Llama-3 chat template and appends the ids
// to dst, returning the extended slice:
//
//	BOS, then per message: StartHeader role EndHeader "\n\n" content EOT
//
// and, if addGenerationPrompt, a trailing StartHeader "assistant" EndHeader
// "\n\n" that the reply continues. Every piece of text is encoded on its own,
// never across a boundary, so that EncodeChat(msgs, true) followed by the
// reply R and EOT is exactly the start of EncodeChat of msgs plus an
// assistant message R plus any later messages: turn N+1's prompt extends turn
// N's, as in vLLM's prefix cache. EncodeChat allocates only to grow dst and
// is safe for concurrent use.
func EncodeChat(dst []int32, msgs []Message, addGenerationPrompt bool) []int32 {
	dst = append(dst, BOS)
	for _, m := range msgs {
		dst = encodeHeader(dst, m.Role)
		dst = Encode(dst, m.Content)
		dst = append(dst, EOT)
	}
	if addGenerationPrompt {
		dst = encodeHeader(dst, assistantRole)
	}
	return dst
}

// EncodeOpen appends m rendered as EncodeChat renders a message, but open:
// without its end of turn, as a chat template continues a final message.
func EncodeOpen(dst []int32, m Message) []int32 {
	dst = encodeHeader(dst, m.Role)
	return Encode(dst, m.Content)
}

func encodeHeader(dst []int32, role string) []int32 {
	dst = append(dst, StartHeader)
	dst = Encode(dst, role)
	dst = append(dst, EndHeader)
	return Encode(dst, headerSep)
}

// CountChat returns len(EncodeChat(nil, msgs, addGenerationPrompt)) without
// allocating. It is safe for concurrent use.
func CountChat(msgs []Message, addGenerationPrompt bool) int {
	n := 1 // BOS
	for _, m := range msgs {
		n += countHeader(m.Role) + Count(m.Content) + 1 // EOT
	}
	if addGenerationPrompt {
		n += countHeader(assistantRole)
	}
	return n
}

func countHeader(role string) int {
	return 2 + Count(role) + Count(headerSep) // StartHeader, EndHeader
}
