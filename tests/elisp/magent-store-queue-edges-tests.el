;;; magent-store-queue-edges-tests.el --- ERT: the edges of the shim's queue  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A real backend per test.  What is pinned here are the edges of the
;; queue: which chunks are queued at all, which batch goes through a
;; spool file, which batch vectors are kept for reuse, how long the
;; list of flush times grows, and what the user is told once a refused
;; session is saved again.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)

;;;; Which chunks are queued

(ert-deftest magent-store-an-empty-or-non-string-chunk-is-not-queued ()
  "An empty chunk, or one that is not a string, queues nothing."
  (magent-store-test--with-backend
    (let ((session (magent-store-test--session "s-empty")))
      (magent-store-append-item-content "s-empty" "item-1" "")
      (magent-store-append-item-content "s-empty" "item-1" nil)
      (magent-store-append-item-content "s-empty" "item-1" 'chunk)
      (should (= (magent-store--unsaved session) 0))
      (should (= (magent-store--session-queued-chars session) 0))
      (magent-store-append-item-content "s-empty" "item-1" "x")
      (should (= (magent-store--unsaved session) 1))
      (magent-store-flush "s-empty")
      (should (equal (magent-store-test--content (magent-store-load "s-empty")) "x")))))

(ert-deftest magent-store-with-persistence-off-no-chunk-is-queued ()
  "With `magent-store-persistence-enabled' nil a chunk is not queued."
  (magent-store-test--with-backend
    (let ((session (magent-store-test--session "s-off")))
      (let ((magent-store-persistence-enabled nil))
        (magent-store-append-item-content "s-off" "item-1" "not kept"))
      (should (= (magent-store--unsaved session) 0))
      (magent-store-append-item-content "s-off" "item-1" "kept")
      (magent-store-flush "s-off")
      (should (equal (magent-store-test--content (magent-store-load "s-off")) "kept")))))

;;;; Inline or through a spool file

(ert-deftest magent-store-a-batch-of-exactly-the-threshold-goes-inline ()
  "A batch of `magent-store-file-threshold' characters goes in the message;
one character more goes through a spool file."
  (magent-store-test--with-backend
    (let ((magent-store-redact nil)
          (magent-store-file-threshold 1000)
          (spooled 0))
      (magent-store-test--session "s-edge")
      (advice-add 'magent-store-spool-file :filter-return
                  (lambda (file) (cl-incf spooled) file)
                  '((name . magent-store-queue-test)))
      (unwind-protect
          (progn
            (magent-store-append-item-content "s-edge" "item-1" (make-string 1000 ?a))
            (magent-store-flush "s-edge")
            (should (= spooled 0))
            (magent-store-append-item-content "s-edge" "item-1" (make-string 1001 ?b))
            (magent-store-flush "s-edge")
            (should (= spooled 1)))
        (advice-remove 'magent-store-spool-file 'magent-store-queue-test))
      (should (equal (magent-store-test--content (magent-store-load "s-edge"))
                     (concat (make-string 1000 ?a) (make-string 1001 ?b)))))))

;;;; Batch vectors kept for reuse

(ert-deftest magent-store-an-empty-flush-leaves-the-batch-vector-in-place ()
  "A flush with nothing queued sends no entries: the session keeps its vector."
  (magent-store-test--with-backend
    (let* ((first (make-vector 256 nil))
           (second (make-vector 256 nil))
           (magent-store--batch-pool (list first second)))
      ;; The turn fills FIRST; its flush hands SECOND to the session.
      (let ((session (magent-store-test--session "s-none")))
        (should (eq (magent-store--session-batch session) second))
        (should (equal magent-store--batch-pool (list first)))
        (should (= (magent-store--session-fill session) 0))
        (magent-store-flush "s-none")
        (should (eq (magent-store--session-batch session) second))
        (should (eq (car magent-store--batch-pool) first))
        (should (= (length magent-store--batch-pool) 1))))))

(ert-deftest magent-store-a-batch-vector-is-kept-for-reuse-up-to-4096-slots ()
  "An acknowledged batch vector of 4096 slots is kept for reuse; a larger one is not."
  (magent-store-test--with-backend
    (let ((magent-store--batch-pool nil)
          (session (magent-store-test--session "s-big")))
      ;; 600 entries of 4 slots: the vector doubles from 256 to 4096.
      (dotimes (i 600)
        (magent-store-append-item-content "s-big" "item-1" (format "<%d>" i)))
      (let ((batch (magent-store--session-batch session)))
        (should (= (length batch) 4096))
        (magent-store-flush "s-big")
        (should (memq batch magent-store--batch-pool)))
      ;; 1100 entries: 8192 slots.
      (dotimes (_ 1100)
        (magent-store-append-item-content "s-big" "item-1" "."))
      (let ((batch (magent-store--session-batch session)))
        (should (= (length batch) 8192))
        (magent-store-flush "s-big")
        (should-not (memq batch magent-store--batch-pool)))
      (should (equal (magent-store-test--content (magent-store-load "s-big"))
                     (concat (mapconcat (lambda (i) (format "<%d>" i))
                                        (number-sequence 0 599) "")
                             (make-string 1100 ?.)))))))

(ert-deftest magent-store-the-batch-pool-holds-at-most-its-maximum ()
  "An acknowledged batch vector joins the pool only while it has room."
  (magent-store-test--with-backend
    (let* ((magent-store--batch-pool nil)
           (session (magent-store-test--session "s-pool"))
           (spare (lambda (n) (cl-loop repeat n collect (make-vector 256 nil)))))
      (magent-store-append-item-content "s-pool" "item-1" "one")
      ;; The flush hands one of them to the session: one slot is left.
      (setq magent-store--batch-pool (funcall spare magent-store--batch-pool-max))
      (let ((batch (magent-store--session-batch session)))
        (magent-store-flush "s-pool")
        (should (memq batch magent-store--batch-pool))
        (should (= (length magent-store--batch-pool) magent-store--batch-pool-max)))
      (magent-store-append-item-content "s-pool" "item-1" " two")
      ;; Full once the session has taken its vector.
      (setq magent-store--batch-pool (funcall spare (1+ magent-store--batch-pool-max)))
      (let ((batch (magent-store--session-batch session)))
        (magent-store-flush "s-pool")
        (should-not (memq batch magent-store--batch-pool))
        (should (= (length magent-store--batch-pool) magent-store--batch-pool-max)))
      (should (equal (magent-store-test--content (magent-store-load "s-pool"))
                     "one two")))))

;;;; Flush times

(ert-deftest magent-store-the-flush-times-are-trimmed-to-128-past-256 ()
  "Past 256 flush times the list keeps the newest 128."
  (magent-store-test--with-backend
    (let ((magent-store-flush-ms (make-list 256 -1.0)))
      (magent-store-test--session "s-ms")
      (should (= (length magent-store-flush-ms) 128))
      (should (>= (car magent-store-flush-ms) 0))
      (should (= (cl-count -1.0 magent-store-flush-ms) 127)))))

;;;; Sessions and scopes

(ert-deftest magent-store-no-scope-and-global-are-the-global-scope ()
  "A session opened with no scope, or with \"global\", is in the global scope."
  (magent-store-test--with-backend
    (magent-store-open "s-nil")
    (magent-store-open "s-str" "global")
    (should (eq (magent-store--session-scope (gethash "s-nil" magent-store--sessions))
                'global))
    (should (eq (magent-store--session-scope (gethash "s-str" magent-store--sessions))
                'global))
    (magent-store-test--start-turn "s-str")
    (magent-store-flush "s-str")
    (should (file-exists-p (expand-file-name "global/s-str.json" magent-store-root)))))

(ert-deftest magent-store-a-flush-request-schedules-the-session-asked-for ()
  "A flush request names its session, whichever session was used last."
  (magent-store-test--with-backend
    (let ((a (magent-store-test--session "s-a"))
          (b (magent-store-test--session "s-b")))
      (should-not (magent-store--session-deadline a))
      (should-not (magent-store--session-deadline b))
      (magent-store-append-event "s-a" (magent-store-test--event "thread-started"))
      (magent-store-flush "s-a")
      (should (equal (car magent-store--recent) "s-a"))
      (magent-store-request-flush "s-b")
      (should (magent-store--session-deadline b))
      (should-not (magent-store--session-deadline a)))))

;;;; Batches held back by redaction

(defun magent-store-queue-test--token ()
  "Return a fake GitHub token, random each time."
  (let ((alnum "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"))
    (concat "gh" "p_" (apply #'string (cl-loop repeat 36 collect
                                               (aref alnum (random (length alnum))))))))

(defun magent-store-queue-test--tick (session)
  "Send SESSION's queue as a tick; wait (3 s at most) for its reply.
Return the batch sent, (NUMBER BATCH FILL LARGE)."
  (let ((deadline (+ (float-time) 3)))
    (magent-store--tick session)
    (prog1 (car (last (magent-store--session-inflight session)))
      (while (and (magent-store--session-inflight session) (< (float-time) deadline))
        (accept-process-output nil 0.05))
      (should-not (magent-store--session-inflight session)))))

(ert-deftest magent-store-held-batches-are-kept-until-all-their-text-is-written ()
  "Batches part of whose text the backend holds back stay in Emacs, in
order; once it has written all of it, they are forgotten and their
vectors reused."
  (magent-store-test--with-backend
    (let ((magent-store-redact '(credentials))
          (magent-store--batch-pool nil)
          (one (magent-store-queue-test--token))
          (two (magent-store-queue-test--token)))
      (let ((session (magent-store-test--session "s-held")))
        (magent-store-append-item-content "s-held" "item-1" (concat "a " (substring one 0 12)))
        (let ((first (magent-store-queue-test--tick session)))
          (should (equal (magent-store--session-held session) (list first)))
          ;; The first token ends; the second starts, in the item's output.
          (magent-store-append-item-content "s-held" "item-1" (concat (substring one 12) " b\n"))
          (magent-store-append-item-content "s-held" "item-1" (concat "c " (substring two 0 12)) t)
          (let ((second (magent-store-queue-test--tick session)))
            (should (equal (magent-store--session-held session) (list first second)))
            (should-not (memq (nth 1 first) magent-store--batch-pool))
            (should-not (memq (nth 1 second) magent-store--batch-pool))
            (magent-store-append-item-content "s-held" "item-1" (concat (substring two 12) " d\n") t)
            (magent-store-flush "s-held")
            (should-not (magent-store--session-held session))
            (should (memq (nth 1 first) magent-store--batch-pool))
            (should (memq (nth 1 second) magent-store--batch-pool)))))
      (let* ((snapshot (plist-get (magent-store-load "s-held") :snapshot))
             (item (aref (alist-get 'items (aref (alist-get 'turns snapshot) 0)) 0)))
        (should (equal (alist-get 'content item) "a [redacted:github-pat] b\n"))
        (should (equal (alist-get 'output item) "c [redacted:github-pat] d\n"))))))

;;;; A refused session saved again

(ert-deftest magent-store-a-refused-session-saved-again-says-nothing-was-lost ()
  "Once the batches of a refused session are saved, the user is told so, once."
  (magent-store-test--with-backend
    (let ((magent-store-retry-interval 0.05)
          (messages nil)
          (session (magent-store-test--session "s-back")))
      ;; Closed in the backend, behind the shim's back: its next batch is refused.
      (magent-store-call "close" (list "s-back"))
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (push (apply #'format-message format args) messages))))
        (magent-store-append-item-content "s-back" "item-1" "after the close")
        (magent-store-request-flush "s-back")
        (let ((deadline (+ (float-time) 30)))
          (while (and (or (not (magent-store--session-opened session))
                          (magent-store--session-inflight session)
                          (> (magent-store--unsaved session) 0))
                      (< (float-time) deadline))
            (sleep-for 0.05)))
        (magent-store-append-item-content "s-back" "item-1" " and more")
        (magent-store-flush "s-back"))
      (should (cl-some (lambda (m) (string-match-p "is not open here" m)) messages))
      (should (= (cl-count-if (lambda (m) (string-match-p
                                           "session s-back is saved again; nothing was lost" m))
                              messages)
                 1))
      (should-not (magent-store--session-refusal session))
      (should (equal (magent-store-test--content (magent-store-load "s-back"))
                     "after the close and more")))))

(provide 'magent-store-queue-edges-tests)
;;; magent-store-queue-edges-tests.el ends here
