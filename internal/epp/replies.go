package epp

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/anthropic"
	"github.com/kvroute/kvroute/internal/openai"
)

// setHeader is a header mutation that replaces any value the client sent:
// a client must not choose its own destination. The value goes in
// raw_value; Envoy rejects a HeaderValue with both value and raw_value.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// destinationReply is the request headers' reply: the destination header
// (and the body's new length when there is one, the new path if not ""),
// the route cache cleared so
// that the route sees the header, and the destination list in the envoy.lb
// dynamic metadata.
func destinationReply(header string, list []string, bodyLen int, hasBody bool, path string) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{setHeader(HeaderDestination, header)}
	if path != "" {
		set = append(set, setHeader(":path", path)) // a stored response's, with its endpoint's own id
	}
	if hasBody {
		// The body may have been rewritten (include_usage): its length is
		// ours to state.
		set = append(set, setHeader("content-length", strconv.Itoa(bodyLen)))
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(strings.Join(list, ",")),
		}}),
	}}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}},
		}},
		DynamicMetadata: md,
	}
}

// passHeaders is the reply that leaves a message's headers as they are.
func passHeaders(response bool) *extprocv3.ProcessingResponse {
	h := &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: h}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: h}}
}

// dropLength is the response headers' reply for a body the picker
// rewrites: its length is no longer the endpoint's (Envoy then sends it
// chunked).
func dropLength() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}}},
	}}}
}

// passTrailers is the reply that leaves trailers as they are.
func passTrailers(response bool) *extprocv3.ProcessingResponse {
	t := &extprocv3.TrailersResponse{}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: t}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: t}}
}

// bodyChunk is one StreamedBodyResponse: in FULL_DUPLEX_STREAMED mode the
// body Envoy forwards is exactly what the picker streams back, and a plain
// (non-streamed) body reply is a protocol error.
func bodyChunk(response bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
	r := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos}},
	}}}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: r}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: r}}
}

// bodyChunks splits b into StreamedBodyResponses of at most chunkBytes, the
// last one carrying eos; an empty body is one empty chunk.
func bodyChunks(response bool, b []byte, eos bool) []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	for {
		n := min(len(b), chunkBytes)
		last := n == len(b)
		out = append(out, bodyChunk(response, b[:n:n], eos && last))
		if last {
			return out
		}
		b = b[n:]
	}
}

// immediate is Envoy's local reply: status with an OpenAI-shaped JSON body,
// and Retry-After (seconds) when not empty.
func immediate(e *openai.Error, retryAfter string, messages bool) *extprocv3.ProcessingResponse {
	data := e.JSON()
	if messages {
		data = anthropic.ErrorJSON(e) // the Messages API's shape on its path
	}
	set := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if retryAfter != "" {
		set = append(set, setHeader("retry-after", retryAfter))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    append(data, '\n'),
		Details: "kvroute_epp_" + strconv.Itoa(e.Status),
	}}}
}
