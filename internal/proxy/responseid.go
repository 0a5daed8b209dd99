package proxy

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/sse"
)

// Responses API ids as the client sees them name the backend that stores
// the response, so that any replica, restarted or not, sends a
// continuation there (router.MintResponseID; decision 0019). Only
// Responses API requests pay for this: a call without ids is copied as
// before.

// responseIDs is what a call maps between the ids its backend uses and
// those its client holds.
type responseIDs struct {
	// mint is set when the response's own id is to be minted for the
	// client (a Responses API POST, when the router mints ids).
	mint bool
	// client and orig are an id the client sent minted (its
	// previous_response_id, or the stored response's id in the path) and
	// the backend's own, which the backend got instead and may echo.
	client, orig string
}

// responsesCall returns what a Responses API POST maps, and the body to
// send upstream: the backend gets its own previous_response_id back. nil
// when there is nothing to map.
func (p *Proxy) responsesCall(body []byte, prev string) (*responseIDs, []byte) {
	ids := &responseIDs{mint: p.router.MintsResponseIDs()}
	if out, orig := request.WithOriginalResponseID(body, prev); orig != "" {
		body, ids.client, ids.orig = out, prev, orig
	}
	if !ids.mint && ids.client == "" {
		return nil, body
	}
	return ids, body
}

// storedResponseRequest returns r with the stored response's id in its path
// as its backend knows it, and what the answer maps back; r itself and nil
// for an id kvroute did not mint.
func storedResponseRequest(r *http.Request, id string) (*http.Request, *responseIDs) {
	orig, minted := router.OriginalResponseID(id)
	if !minted {
		return r, nil
	}
	u := *r.URL
	u.Path = strings.Replace(u.Path, "/"+id, "/"+orig, 1)
	u.RawPath = ""
	r2 := r.Clone(r.Context())
	r2.URL = &u
	return r2, &responseIDs{client: id, orig: orig}
}

// idRewriter rewrites the ids of one attempt's answer, as JSON strings:
// the backend's ids become the client's.
type idRewriter struct {
	from, to [][]byte // quoted ids
}

func (ir *idRewriter) add(orig, client string) {
	if orig == "" || orig == client {
		return
	}
	ir.from = append(ir.from, strconv.AppendQuote(nil, orig))
	ir.to = append(ir.to, strconv.AppendQuote(nil, client))
}

// rewrite returns b with the ids replaced; b itself if none is in it.
func (ir *idRewriter) rewrite(b []byte) []byte {
	for i, from := range ir.from {
		if !bytes.Contains(b, from) {
			continue
		}
		b = bytes.ReplaceAll(b, from, ir.to[i])
	}
	return b
}

// idWriter rewrites a Responses API stream's ids on their way to the
// client. The copier writes whole events, so that an id is never split
// between two writes; the response's id is known from the first event
// (response.created), which the scanner reads before it is written.
type idWriter struct {
	http.ResponseWriter // the attempt's heldWriter
	sc                  *sse.Scanner
	r                   *router.Router
	b                   *fleet.Backend
	ids                 *responseIDs
	learned             bool
	ir                  idRewriter
}

func newIDWriter(w http.ResponseWriter, sc *sse.Scanner, r *router.Router, b *fleet.Backend, ids *responseIDs) *idWriter {
	iw := &idWriter{ResponseWriter: w, sc: sc, r: r, b: b, ids: ids}
	iw.ir.add(ids.orig, ids.client)
	return iw
}

func (w *idWriter) Write(b []byte) (int, error) {
	if !w.learned && w.sc.ResponseID != "" {
		w.learned = true
		if w.ids.mint {
			w.ir.add(w.sc.ResponseID, w.r.MintResponseID(w.sc.ResponseID, w.b))
		}
	}
	if _, err := w.ResponseWriter.Write(w.ir.rewrite(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// FlushError flushes as the writer underneath does.
func (w *idWriter) FlushError() error { return sse.FlusherOf(w.ResponseWriter).FlushError() }

// Unwrap lets http.ResponseController reach the connection.
func (w *idWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// copyResponse copies a Responses API answer that is not a stream with its
// ids rewritten: the body is read whole (a response object, a few
// kilobytes; up to maxCaptureBytes, past which the rest follows as it
// is), its usage and id read, its length set anew.
func (a *attempt) copyResponse(hw *heldWriter, res *http.Response, body io.Reader) (readErr, writeErr error) {
	capture := captures.Get().(*bytes.Buffer)
	capture.Reset()
	defer func() {
		if capture.Cap() <= maxPooledCapture {
			captures.Put(capture)
		}
	}()
	bp := bodyBufs.Get().(*[]byte)
	defer bodyBufs.Put(bp)
	buf, whole := *bp, false
	for capture.Len() < maxCaptureBytes {
		n, err := body.Read(buf)
		if n > 0 {
			a.FirstToken()
			capture.Write(buf[:n])
		}
		if err == io.EOF {
			whole = true
			break
		}
		if err != nil {
			return err, nil
		}
	}
	out := capture.Bytes()
	var ir idRewriter
	ir.add(a.c.ids.orig, a.c.ids.client)
	if a.c.req != nil {
		if u, ok := sse.ParseUsage(jsonscan.Field(out, "usage")); ok {
			a.setUsage(u)
		}
		a.out.ResponseID = jsonscan.StringValue(jsonscan.Field(out, "id"))
		if a.c.ids.mint {
			ir.add(a.out.ResponseID, a.p.router.MintResponseID(a.out.ResponseID, a.t.Backend))
		}
	}
	if whole {
		out = ir.rewrite(out)
		hw.header.Set("Content-Length", strconv.Itoa(len(out)))
	}
	if _, err := hw.Write(out); err != nil {
		return nil, err
	}
	if whole {
		return nil, nil
	}
	_, err := io.CopyBuffer(hw, body, buf)
	if err != nil {
		return err, nil // the copy's write errors are the client's, but the body is cut either way
	}
	return nil, nil
}
