package workload

import (
	"math/rand/v2"
	"strings"
)

// vocabulary is a list of common English words for synthetic prompt text.
// With the emulator's tokenizer (and real BPE ones) it runs at about four
// bytes per token, like ordinary prose.
var vocabulary = strings.Fields(`
the of and to in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if so what no more out up into do any
your them some time only new about could these two may first then other its over such our man any me
even most made after also did many before must through back where much your way well down should because
each just those people how too little state good very make world still see own men work long get here
between both life being under never day same another know while last might us great old year off come
since against go came right used take three states himself few house use during without again place
american around however home small found thought went say part once general high upon school every
does got united left number course war until always away something fact though water less public put
think almost hand enough far took head yet government system better set told nothing night end why
called eyes find going look asked later knew point next program city business give group toward
young days let room president side social given present several order national possible rather second
face per among form important often things looked early white case john become large big need four
within felt along children saw best church ever least power development light thing seemed family
interest want members mind country area others although turned done open god service problem certain
kind different thus began door help means sense whole matter perhaps itself york times law human line
above name example action company hands local show whether five history gave today either act feet
across taken past quite anything seen having death experience body word half really field am car words
already themselves information tell together college shall money period held keep sure probably free
seems political real behind cannot miss question air office making brought whose special major heard
problems federal became study ago moment available known result street economic boy position reason
change south board individual job society areas west close turn love community true court force full
`)

// Text returns about n bytes of deterministic English-like prose for rng:
// sentences of common words with capitals and full stops.
func Text(rng *rand.Rand, n int) string {
	var sb strings.Builder
	sb.Grow(n + 16)
	start := true
	for sb.Len() < n {
		w := vocabulary[rng.IntN(len(vocabulary))]
		if start {
			sb.WriteString(strings.ToUpper(w[:1]))
			sb.WriteString(w[1:])
			start = false
		} else {
			sb.WriteByte(' ')
			sb.WriteString(w)
		}
		if rng.IntN(12) == 0 {
			sb.WriteString(". ")
			start = true
		}
	}
	return strings.TrimSpace(sb.String())
}
