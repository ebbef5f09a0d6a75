;;; magent-store-alloc-tests.el --- What a streamed chunk allocates  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Allocation turns into garbage collections in the user's Emacs, and it
;; is deterministic: `memory-use-counts' before and after a stream says
;; exactly what was allocated, with no timing in it.  These tests stream
;; chunks through the byte-compiled shim into the real backend, ticks
;; and their replies included, and bound the bytes per chunk beyond the
;; chunk itself.  The bounds are structural: a chunk may cost its time
;; (one float) and its share of the ticks, and nothing that grows with
;; every chunk (a list per chunk, a copy of the chunk, a per-chunk
;; timer) fits under them.  tests/elisp/upstream/ has the same through
;; magent's own append with `magent-store-mode' on.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)
(require 'magent-store-test-alloc)

(ert-deftest magent-store-alloc-a-chunk-allocates-its-time-and-share-of-a-tick ()
  "Through the public API a chunk costs at most 64 bytes, ticks included.
That is its time (one float) and its share of the ticks and replies:
the list a chunk used to be queued as was 80 bytes by itself."
  (magent-store-test--with-backend
    (magent-store-test-alloc--compile)
    (magent-store-test--session "s-alloc")
    (let* ((n 396)
           (session (gethash "s-alloc" magent-store--sessions))
           (magent-store-flush-interval 3600)
           (send (byte-compile
                  (lambda (chunk)
                    (magent-store-append-item-content "s-alloc" "item-1" chunk)
                    (magent-store-request-flush "s-alloc"))))
           (idle (byte-compile (lambda (_chunk) nil)))
           ;; A first stream fills the reused batch vectors.
           (_ (magent-store-test-alloc--stream
               send (magent-store-test-alloc--chunks n) session))
           (chunks (magent-store-test-alloc--chunks n))
           (with (magent-store-test-alloc--counting
                   (magent-store-test-alloc--stream send chunks session)))
           (without (magent-store-test-alloc--counting
                      (magent-store-test-alloc--stream idle chunks nil)))
           (per-chunk (/ (float (magent-store-test-alloc--bytes
                                 (cl-mapcar #'- with without)))
                         n)))
      (message "public API: %.1f bytes per chunk (%S)" per-chunk
               (cl-mapcar #'- with without))
      (should (<= per-chunk 64))
      ;; Every chunk arrived, in order.
      (should (equal (magent-store-test--content
                      (magent-store-load "s-alloc"))
                     (concat (mapconcat #'identity
                                        (magent-store-test-alloc--chunks n) "")
                             (mapconcat #'identity chunks "")))))))

(ert-deftest magent-store-alloc-no-timer-is-pending-while-chunks-stream ()
  "While a batch awaits its reply, no flush timer is pending.
Emacs copies and decodes every pending timer each time it wakes up;
the reply, delayed a second at most, sends what queued meanwhile."
  (magent-store-test--with-backend
    (let ((session (magent-store-test--session "s-timer"))
          (magent-store-flush-interval 0.05))
      (magent-store-append-item-content "s-timer" "item-1" "first ")
      ;; The first chunk after a quiet spell needs the timer.
      (should (timerp (magent-store--session-timer session)))
      (sleep-for 0.06)
      (magent-store-append-item-content "s-timer" "item-1" "second ")
      ;; Past the deadline: that chunk sent the batch and took the timer.
      (should-not (magent-store--session-timer session))
      (should (magent-store--session-inflight session))
      (magent-store-append-item-content "s-timer" "item-1" "third")
      (should-not (magent-store--session-timer session))
      ;; The stream stops; the reply sends the last chunk.
      (let ((deadline (+ (float-time) 5)))
        (while (and (or (magent-store--session-inflight session)
                        (> (magent-store--session-fill session) 0))
                    (< (float-time) deadline))
          (accept-process-output nil 0.05)))
      (should (= (magent-store--session-fill session) 0))
      (should (equal (magent-store-test--content (magent-store-load "s-timer"))
                     "first second third")))))

(provide 'magent-store-alloc-tests)
;;; magent-store-alloc-tests.el ends here
