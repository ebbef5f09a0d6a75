;;; magent-store-stream-tests.el --- A stream long enough for replies to cross it  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The backend may hold a tick's reply for up to a second, and a reply
;; recycles the batch vector it acknowledges while the next batch fills.
;; A short stream never has a reply arrive while chunks are queued: this
;; one streams for several seconds, as a long answer does, and checks
;; that it did, and that every chunk is stored once, in order.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-tests)

(ert-deftest magent-store-replies-arriving-mid-stream-lose-no-chunk ()
  "Replies that arrive while chunks are queued: every chunk once, in order."
  (magent-store-test--with-backend
    (magent-store-open "s-long")
    (magent-store-test--start-turn "s-long")
    (magent-store-flush "s-long")
    (let* ((session (gethash "s-long" magent-store--sessions))
           (crossed 0)
           (replies 0)
           (chunks (let (out)
                     (dotimes (i 600)
                       (push (format "%s%d|" (nth (% i 40) magent-store-test--chunks) i)
                             out))
                     (nreverse out)))
           (magent-store--flushed-function
            (lambda (_sent _record _reply)
              (cl-incf replies)
              (when (> (magent-store--session-fill session) 0)
                (cl-incf crossed)))))
      ;; About four seconds of streaming, a chunk every 5 ms or so.
      (magent-store-test--stream "s-long" chunks 0.005)
      (should (= (magent-store-flush "s-long") (+ 3 (length chunks))))
      ;; The case this test is for happened, more than once.
      (should (> crossed 2))
      (should (> replies crossed))
      (should (equal (magent-store-test--content (magent-store-load "s-long"))
                     (apply #'concat chunks))))))

(provide 'magent-store-stream-tests)
;;; magent-store-stream-tests.el ends here
