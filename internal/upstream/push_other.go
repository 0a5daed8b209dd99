//go:build !unix

package upstream

import (
	"errors"
	"syscall"
)

// canPushSocket: elsewhere a stream is read, not pushed.
const canPushSocket = false

func (b *leanBody) pushSocket(syscall.RawConn, *chunkDecoder, Sink) error {
	return errors.ErrUnsupported
}

func (c *leanConn) initPush() {}
